"""PPO advantage math as pure tensor functions: token-level rewards, GAE, masked statistics.

Everything works on right-padded (rows, max_len) tensors with a response mask (1 on real response tokens)
and is vectorised over rows; ``pad_rows`` converts from lists of per-row 1-D tensors (``columnar.unpadded_rows`` is the way back, to one flat buffer).
Padding never leaks into results: padded positions of every output are 0 and no statistic counts them.
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from mindspeed_rl.models.loss.grpo_loss import kl_penalty

Rows = Union[Tensor, Sequence[Tensor]]
WHITEN_EPS = 1e-8


def pad_rows(rows: Sequence[Tensor], pad_value: float = 0.0,
             dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    """Right-pad 1-D tensors into (len(rows), max_len); returns (padded, mask), mask bool (True on real items)."""
    rows = [torch.as_tensor(r).reshape(-1) for r in rows]
    if dtype is None:
        dtype = rows[0].dtype if rows else torch.float32
    device = rows[0].device if rows else torch.device("cpu")
    width = max((r.numel() for r in rows), default=0)
    padded = torch.full((len(rows), width), pad_value, dtype=dtype, device=device)
    mask = torch.zeros((len(rows), width), dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        padded[i, :r.numel()] = r.to(dtype=dtype, device=device)
        mask[i, :r.numel()] = True
    return padded, mask


def _lengths(response_length) -> Tensor:
    if isinstance(response_length, Tensor):
        return response_length.reshape(-1).long()
    return torch.tensor([int(n) for n in response_length], dtype=torch.long)


def _float_mask(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(device=like.device, dtype=torch.float32)


def masked_mean(x: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Mean of x over the positions where mask is set (over all of them, or along ``dim``); 0 where none is."""
    m = _float_mask(mask, x)
    total = torch.where(m > 0, x.float() * m, 0.0)  # where(): non-finite padding cannot leak
    if dim is None:
        count = m.sum()
        return torch.where(count > 0, total.sum() / count.clamp(min=1e-12), torch.zeros_like(count))
    count = m.sum(dim=dim)
    return torch.where(count > 0, total.sum(dim=dim) / count.clamp(min=1e-12), torch.zeros_like(count))


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of x over the masked positions (Bessel-corrected when ``unbiased`` and more than one)."""
    m = _float_mask(mask, x)
    mean = masked_mean(x, m)
    var = masked_mean((x.float() - mean).square(), m)
    count = m.sum()
    if unbiased:
        var = torch.where(count > 1, var * count / (count - 1).clamp(min=1e-12), var)
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(x - mean) / sqrt(var + 1e-8) with the masked mean and (unbiased) variance of the whole tensor.

    With ``shift_mean=False`` the mean is added back (only the scale changes). Padded positions are 0.
    """
    m = _float_mask(mask, x)
    mean = masked_mean(x, m)
    white = (x.float() - mean) * torch.rsqrt(masked_var(x, m) + WHITEN_EPS)
    if not shift_mean:
        white = white + mean
    return torch.where(m > 0, white, 0.0)


def kl_in_reward(old_log_probs: Rows, ref_log_probs: Rows, kind: str = "kl",
                 mask: Optional[Tensor] = None) -> Rows:
    """Per-token KL estimate (grpo_loss.kl_penalty kinds) of the rollout policy against the reference.

    Padded tensors give a padded tensor (0 where ``mask`` is not set); lists of rows give a list of rows.
    """
    if isinstance(old_log_probs, Tensor):
        kl = kl_penalty(old_log_probs.float(), ref_log_probs.float(), kind)
        return kl if mask is None else torch.where(_float_mask(mask, kl) > 0, kl, 0.0)
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
    lengths = _lengths(response_length).to(scores.device)
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
    mask = _float_mask(response_mask, token_level_rewards)
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
