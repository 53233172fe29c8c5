"""GRPO math as pure tensor functions: group-normalised advantages, KL penalties, clipped loss."""
from typing import Dict, Optional, Tuple, Union

import torch

KL_KINDS = ("kl", "abs", "mse", "low_var_kl")


def compute_group_norm_advantages(rewards: torch.Tensor, n_samples: int, eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps) over groups of n_samples consecutive rows.

    The std is the unbiased (Bessel-corrected) one, torch.std's default, as upstream uses.
    A group whose rewards are all equal, and any group of size 1, gets advantage 0.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    if rewards.numel() % n_samples != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {n_samples}")
    scores = rewards.float().view(-1, n_samples)
    centred = scores - scores.mean(dim=1, keepdim=True)
    if n_samples == 1:
        return centred.view(-1)  # all zeros; unbiased std is undefined for one sample
    std = scores.std(dim=1, keepdim=True)
    return (centred / (std + eps)).view(-1)


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference from sampled-token log-probs.

    kl: logp - ref; abs: |logp - ref|; mse: 0.5 (logp - ref)^2;
    low_var_kl: k3 = exp(ref - logp) - (ref - logp) - 1, the log-ratio clamped to [-20, 20]
    before exp for stability and the result clamped to [-10, 10].
    """
    if kind == "kl":
        return log_probs - ref_log_probs
    if kind == "abs":
        return (log_probs - ref_log_probs).abs()
    if kind == "mse":
        return 0.5 * (log_probs - ref_log_probs).square()
    if kind == "low_var_kl":
        log_ratio = torch.clamp(ref_log_probs - log_probs, min=-20.0, max=20.0)
        k3 = torch.exp(log_ratio) - log_ratio - 1.0
        return torch.clamp(k3, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl kind {kind!r}; known: {list(KL_KINDS)}")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = float(mask.sum())
    if count == 0:
        return 0.0
    return float(torch.where(mask > 0, values.detach() * mask, 0.0).sum()) / count


def grpo_loss(
    log_probs: torch.Tensor,
    old_log_probs: Optional[torch.Tensor],
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_ratio: float = 0.2,
    ref_log_probs: Optional[torch.Tensor] = None,
    kl_coef: float = 0.0,
    kl_kind: str = "low_var_kl",
    entropy: Optional[torch.Tensor] = None,
    entropy_coeff: float = 0.0,
    token_count: Optional[Union[int, float, torch.Tensor]] = None,
    clip_ratio_low: Optional[float] = None,
    clip_ratio_high: Optional[float] = None,
    token_level_loss: bool = True,
    is_weights: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """PPO-clipped GRPO/DAPO loss summed over response tokens and divided by token_count.

    log_probs, old_log_probs, ref_log_probs, entropy and mask are (B, T); advantages is (B,)
    (one value per sequence, broadcast over T) or already (B, T). Per token:
        max(-A r, -A clip(r, 1 - c, 1 + c)) + kl_coef * kl_penalty - entropy_coeff * entropy
    with r = exp(logp - old_logp). token_count defaults to mask.sum(); pass the token count of
    the whole mini-batch (all ranks, all micro-batches) so that summing the pieces' gradients
    equals the gradient of the full batch. old_log_probs=None means on-policy (r = 1).
    Metrics are token means over this call's mask.

    DAPO: the ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high] (each defaults to
    clip_ratio); ``actor/clip_frac_low`` / ``_high`` are the token fractions clipped at either end
    (negative advantage below 1 - low, positive advantage above 1 + high). With
    ``token_level_loss=False`` each sequence's tokens are averaged first (seq-mean-token-mean):
    the sum runs over sequences and token_count counts sequences (default: this call's).
    ``is_weights`` (B, T): rollout correction's importance weights, multiplying the clipped policy-gradient
    term of each token (not the KL or entropy terms); rejected tokens are left out through ``mask``.
    """
    if old_log_probs is None:
        old_log_probs = log_probs.detach()
    mask = mask.to(log_probs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(log_probs.dtype)

    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    ratio = torch.exp(log_probs - old_log_probs)
    pg_unclipped = -advantages * ratio
    pg_clipped = -advantages * torch.clamp(ratio, 1.0 - low, 1.0 + high)
    pg = torch.maximum(pg_unclipped, pg_clipped)
    if is_weights is not None:
        pg = pg * is_weights.to(pg.dtype).detach()
    per_token = pg
    clipped = pg_clipped > pg_unclipped

    metrics = {
        "actor/pg_loss": _masked_mean(pg, mask),
        "actor/clip_frac": _masked_mean(clipped.to(mask.dtype), mask),
        "actor/clip_frac_low": _masked_mean((clipped & (advantages < 0)).to(mask.dtype), mask),
        "actor/clip_frac_high": _masked_mean((clipped & (advantages > 0)).to(mask.dtype), mask),
        "actor/kl": 0.0,
        "actor/entropy": 0.0,
    }
    if ref_log_probs is not None:
        kl = kl_penalty(log_probs, ref_log_probs, kl_kind)
        metrics["actor/kl"] = _masked_mean(kl, mask)
        if kl_coef != 0.0:
            per_token = per_token + kl_coef * kl
    elif kl_coef != 0.0:
        raise ValueError("kl_coef is non-zero but ref_log_probs is None")
    if entropy is not None:
        metrics["actor/entropy"] = _masked_mean(entropy, mask)
        if entropy_coeff != 0.0:
            per_token = per_token - entropy_coeff * entropy
    elif entropy_coeff != 0.0:
        raise ValueError("entropy_coeff is non-zero but entropy is None")

    if not token_level_loss:  # each sequence weighs the same, whatever its length
        mask = mask / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    if token_count is None:
        denom = mask.sum().clamp(min=1.0) if token_level_loss else (mask.sum(dim=-1) > 0).sum().clamp(min=1)
    else:
        if not torch.is_tensor(token_count) and token_count <= 0:
            raise ValueError(f"token_count must be positive, got {token_count}")
        denom = token_count
    # where() rather than a product, so non-finite values at padded positions cannot leak in
    loss = torch.where(mask > 0, per_token * mask, 0.0).sum() / denom
    return loss, metrics
