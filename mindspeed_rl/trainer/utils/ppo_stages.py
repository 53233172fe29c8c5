"""PPO's KL-shaped token rewards on the whole round (use_kl_in_reward); GAE is the advantage stage's estimator.

The math is in mindspeed_rl/algorithms/gae.py (pure tensors); this reads the
stage's columns from the dock in row order and puts the results back."""
from typing import Dict

import torch

from mindspeed_rl.algorithms import gae as adv
from mindspeed_rl.algorithms.masked import masked_mean, pad_rows
from mindspeed_rl.plan.stages import LOSS_MASK
from mindspeed_rl.data.columnar import unpadded_rows
from mindspeed_rl.data.driver_dock import put_columns


def _scores(batch) -> torch.Tensor:
    return torch.cat([s.reshape(1).float() for s in batch["rm_scores"]])


def _lengths(batch) -> torch.Tensor:
    return torch.tensor([int(x) for x in batch["response_length"]])


def compute_kl_rewards(td, stage, kl_coef: float, kl_penalty: str) -> Dict[str, float]:
    """use_kl_in_reward: each row's score on its last response token, minus ``kl_coef`` times the
    per-token KL of the rollout policy (old log-probs) from the reference."""
    rows = list(range(stage.rows_per_share))
    batch = td.get_rows(list(stage.inputs), rows)
    old, _ = pad_rows([t.float() for t in batch["old_log_prob"]])
    ref, _ = pad_rows([t.float() for t in batch["ref_log_prob"]])
    kl = adv.kl_in_reward(old, ref, kl_penalty)
    if LOSS_MASK in batch:  # multi-turn: no KL on the tool's tokens (the policy did not sample them)
        model, _ = pad_rows([m.float().reshape(-1) for m in batch[LOSS_MASK]])
        kl = torch.where(model[:, :kl.shape[1]] > 0, kl, 0.0)
    lengths = _lengths(batch)
    rewards, mask = adv.token_level_rewards(_scores(batch), lengths, kl=kl, kl_coef=kl_coef)
    put_columns(td, {stage.outputs[0]: unpadded_rows(rewards, lengths)}, rows)
    return {"actor/reward_kl": masked_mean(kl, mask).item(), "actor/reward_kl_coef": float(kl_coef)}
