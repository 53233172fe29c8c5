"""The actor's loss: a registered policy loss per token, rollout correction's weights, KL and entropy
terms, aggregated by loss_agg_mode. Every policy loss gets the same inputs and the same aggregation."""
from typing import Dict, Optional, Tuple, Union

import torch

from mindspeed_rl.algorithms.aggregation import agg_loss
from mindspeed_rl.algorithms.kl import kl_penalty
from mindspeed_rl.algorithms.registry import get_policy_loss_fn


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = float(mask.sum())
    if count == 0:
        return 0.0
    return float(torch.where(mask > 0, values.detach() * mask, 0.0).sum()) / count


def actor_loss(
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
    loss_mode: str = "vanilla",
    loss_agg_mode: Optional[str] = None,
    horizon: Optional[float] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Per token: pg + kl_coef * kl_penalty - entropy_coeff * entropy, aggregated; (loss, metrics).

    pg is the registered ``loss_mode`` (vanilla: PPO's clip, gspo, cispo) with the ratio bounds
    [1 - clip_ratio_low, 1 + clip_ratio_high] (each defaults to clip_ratio), times ``is_weights`` (rollout
    correction) where given; rejected tokens are left out through ``mask``. log_probs, old_log_probs,
    ref_log_probs, entropy, mask, is_weights are (B, T); advantages (B, T), or (B,) broadcast over T.
    old_log_probs=None means on-policy (r = 1). ``loss_agg_mode`` (default: token-mean, or
    seq-mean-token-mean when ``token_level_loss`` is false) divides by ``token_count``: pass the whole
    mini-batch's denominator (aggregation.denominator) so the pieces' gradients add up; by default it is
    this call's own. ``horizon``: seq-mean-token-sum-norm's length (default T). Metrics are token means
    over this call's mask; ``actor/clip_frac_low`` / ``_high``: clipped tokens with negative / positive
    advantage.
    """
    if old_log_probs is None:
        old_log_probs = log_probs.detach()
    mode = loss_agg_mode or ("token-mean" if token_level_loss else "seq-mean-token-mean")
    pg_fn = get_policy_loss_fn(loss_mode)
    mask = mask.to(log_probs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(log_probs.dtype)
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    pg, clipped = pg_fn(log_probs, old_log_probs, advantages, mask, low, high)
    if is_weights is not None:
        pg = pg * is_weights.to(pg.dtype).detach()
    per_token = pg
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
    return agg_loss(per_token, mask, mode, token_count, horizon), metrics
