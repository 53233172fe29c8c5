"""PPO's driver stages on the whole round: KL-shaped token rewards and GAE.

The math is in trainer/utils/advantages.py (pure tensors); these read the
stage's columns from the dock in row order and put the results back."""
from typing import Dict

import torch

from mindspeed_rl.trainer.utils import advantages as adv
from mindspeed_rl.trainer.utils.columnar import unpadded_rows
from mindspeed_rl.trainer.utils.compute_utils import advantage_stats, dock_call, put_columns


def _scores(batch) -> torch.Tensor:
    return torch.cat([s.reshape(1).float() for s in batch["rm_scores"]])


def _lengths(batch) -> torch.Tensor:
    return torch.tensor([int(x) for x in batch["response_length"]])


def compute_kl_rewards(td, stage, kl_coef: float, kl_penalty: str) -> Dict[str, float]:
    """use_kl_in_reward: each row's score on its last response token, minus ``kl_coef`` times the
    per-token KL of the rollout policy (old log-probs) from the reference."""
    rows = list(range(stage.rows_per_share))
    batch = dock_call(td, "get_rows", list(stage.inputs), rows)
    old, _ = adv.pad_rows([t.float() for t in batch["old_log_prob"]])
    ref, _ = adv.pad_rows([t.float() for t in batch["ref_log_prob"]])
    kl = adv.kl_in_reward(old, ref, kl_penalty)
    lengths = _lengths(batch)
    rewards, mask = adv.token_level_rewards(_scores(batch), lengths, kl=kl, kl_coef=kl_coef)
    put_columns(td, {stage.outputs[0]: unpadded_rows(rewards, lengths)}, rows)
    return {"actor/reward_kl": adv.masked_mean(kl, mask).item(), "actor/reward_kl_coef": float(kl_coef)}


def compute_gae(td, stage, gamma: float, lam: float) -> Dict[str, float]:
    """GAE over the critic's values (token rewards from compute_kl when present, else the score on the
    last token); advantages whitened over the round; returns = advantages + values before whitening."""
    rows = list(range(stage.rows_per_share))
    batch = dock_call(td, "get_rows", list(stage.inputs), rows)
    lengths = _lengths(batch)
    values, mask = adv.pad_rows([t.float() for t in batch["values"]])
    if "token_level_rewards" in batch:
        rewards, _ = adv.pad_rows([t.float() for t in batch["token_level_rewards"]])
    else:
        rewards, _ = adv.token_level_rewards(_scores(batch), lengths)
    advantages, returns = adv.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    out_adv = unpadded_rows(advantages, lengths)  # the round's response tokens in one tensor
    put_columns(td, dict(zip(stage.outputs, (out_adv, unpadded_rows(returns, lengths)))), rows)
    metrics = advantage_stats(out_adv[0])
    metrics.update({"critic/returns_mean": adv.masked_mean(returns, mask).item(),
                    "critic/values_mean": adv.masked_mean(values, mask).item()})
    return metrics
