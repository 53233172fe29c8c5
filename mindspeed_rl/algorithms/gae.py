"""PPO's advantage math: token-level rewards, the KL taken into them, GAE (registered as ``gae``).

Everything works on right-padded (rows, max_len) tensors with a response mask (True on real response
tokens) and is vectorised over rows; padded positions of every output are 0.
"""
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from mindspeed_rl.algorithms.kl import kl_penalty
from mindspeed_rl.algorithms.masked import Rows, float_mask, as_lengths, masked_whiten, pad_rows
from mindspeed_rl.algorithms.registry import register_adv_est

def kl_in_reward(old_log_probs: Rows, ref_log_probs: Rows, kind: str = "kl",
                 mask: Optional[Tensor] = None) -> Rows:
    """Per-token KL estimate (grpo_loss.kl_penalty kinds) of the rollout policy against the reference.

    Padded tensors give a padded tensor (0 where ``mask`` is not set); lists of rows give a list of rows.
    """
    if isinstance(old_log_probs, Tensor):
        kl = kl_penalty(old_log_probs.float(), ref_log_probs.float(), kind)
        return kl if mask is None else torch.where(float_mask(mask, kl) > 0, kl, 0.0)
    if len(old_log_probs) != len(ref_log_probs):
        raise ValueError(f"{len(old_log_probs)} rows of log-probs but {len(ref_log_probs)} of reference")
    return [kl_penalty(o.float(), r.float(), kind) for o, r in zip(old_log_probs, ref_log_probs)]


def token_level_rewards(scores: Union[Tensor, Sequence[float]], response_length, kl: Optional[Rows] = None,
                        kl_coef: float = 0.0) -> Tuple[Tensor, Tensor]:
    """Per-token rewards: each row's sequence score on its last response token, minus ``kl_coef * kl``.

    scores: (rows,); response_length: (rows,) token counts; kl: per-token KL, (rows, T) padded or a list
    of rows. Returns (rewards (rows, max_len) float32, mask bool); max_len is kl's width when kl is a
    padded tensor, else the longest response. A row with no response gets no reward.
    """
    scores = torch.as_tensor(scores, dtype=torch.float32).reshape(-1)
    lengths = as_lengths(response_length).to(scores.device)
    if lengths.numel() != scores.numel():
        raise ValueError(f"{scores.numel()} scores for {lengths.numel()} response lengths")
    if kl is not None and not isinstance(kl, Tensor):
        kl = pad_rows(list(kl), dtype=torch.float32)[0]
    width = int(lengths.max()) if lengths.numel() else 0
    if kl is not None:
        if kl.shape[0] != scores.numel() or kl.shape[1] < width:
            raise ValueError(f"kl of shape {tuple(kl.shape)} does not cover {scores.numel()} rows of up to "
                             f"{width} tokens")
        width = kl.shape[1]
    cols = torch.arange(width, device=scores.device)
    mask = cols[None, :] < lengths[:, None]
    last = cols[None, :] == (lengths[:, None] - 1)  # no column when the length is 0
    rewards = torch.where(last, scores[:, None], 0.0)
    if kl is not None and kl_coef != 0.0:
        rewards = rewards - kl_coef * torch.where(mask, kl.to(rewards.device).float(), 0.0)
    return rewards, mask


def model_token_rewards(rewards: Tensor, mask: Tensor, model_mask: Tensor) -> Tuple[Tensor, Tensor]:
    """Multi-turn rows: only the model's tokens (``model_mask``, the loss mask) take part in GAE. Returns (rewards,
    mask & model_mask) with each row's reward on tokens outside the model's (the score sits on the last response
    token, which may be a tool answer's) moved to its last model token; a row without model tokens keeps none."""
    on = float_mask(mask, rewards).bool() & float_mask(model_mask, rewards).bool()
    off_sum = torch.where(on, 0.0, rewards.float()).sum(dim=1)
    cols = torch.arange(rewards.shape[1], device=rewards.device)
    last = torch.where(on, cols[None, :], -1).max(dim=1).values
    moved = torch.where(on, rewards.float(), 0.0)
    rows = torch.nonzero(last >= 0).reshape(-1)
    moved[rows, last[rows]] += off_sum[rows]
    return moved, on


def compute_gae_advantage_return(token_level_rewards: Rows, values: Rows, response_mask: Optional[Tensor],
                                 gamma: float, lam: float) -> Tuple[Tensor, Tensor]:
    """Generalised advantage estimation; returns (advantages whitened over the batch, returns).

    Per row, from the last token back: delta_t = r_t + gamma * V_next - V_t and
    A_t = delta_t + gamma * lam * A_next, where "next" is the next masked token (0 after the last one), so
    positions outside the mask are skipped and their rewards / values never count. returns = A + V (before
    whitening); the advantages are then whitened over all masked tokens of the batch (``masked_whiten``).
    Inputs are (rows, T) padded tensors, or lists of per-row 1-D tensors (the mask then defaults to their
    lengths). Outputs are (rows, T) float32, 0 at padded positions.
    """
    if not isinstance(token_level_rewards, Tensor):
        token_level_rewards, lengths_mask = pad_rows(list(token_level_rewards), dtype=torch.float32)
        response_mask = lengths_mask if response_mask is None else response_mask
    if not isinstance(values, Tensor):
        values = pad_rows(list(values), dtype=torch.float32)[0]
    if response_mask is None:
        raise ValueError("response_mask is needed with padded tensors")
    if values.shape != token_level_rewards.shape or response_mask.shape != token_level_rewards.shape:
        raise ValueError(f"shapes differ: rewards {tuple(token_level_rewards.shape)}, values "
                         f"{tuple(values.shape)}, mask {tuple(response_mask.shape)}")
    mask = float_mask(response_mask, token_level_rewards)
    on = mask > 0
    rewards = torch.where(on, token_level_rewards.float(), 0.0)
    vals = torch.where(on, values.float().to(rewards.device), 0.0)
    rows, width = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rows, device=rewards.device)
    next_adv = torch.zeros(rows, device=rewards.device)
    for t in range(width - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - vals[:, t]
        adv = delta + gamma * lam * next_adv
        here = on[:, t]
        advantages[:, t] = torch.where(here, adv, 0.0)
        # a position outside the mask passes the running value and advantage through unchanged
        next_value = torch.where(here, vals[:, t], next_value)
        next_adv = torch.where(here, adv, next_adv)
    returns = advantages + vals
    return masked_whiten(advantages, mask), returns


def gae_advantages(token_level_rewards: Tensor, response_mask: Tensor, n_samples: int, spec,
                   values: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """PPO: GAE over the critic's values with ``spec.gamma`` and ``spec.lam`` (groups play no part)."""
    if values is None:
        raise ValueError("adv_estimator 'gae' needs the critic's values")
    return compute_gae_advantage_return(token_level_rewards, values, response_mask, spec.gamma, spec.lam)


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_adv_est("gae", critic=True)(gae_advantages)
