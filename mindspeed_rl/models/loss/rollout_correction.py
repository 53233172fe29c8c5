"""Rollout correction as pure tensor functions: importance weights and rejection masks between the trainer's
old log-probs and the rollout engine's log-probs of the sampled tokens (verl's ``algorithm.rollout_correction``).

``log_ratio = old - rollout`` per token (log pi_train / pi_rollout). All inputs are (B, T) with a 0/1 ``mask`` of
real tokens; padded positions get weight 0 and are never rejected or counted.

- IS weights (``rollout_is``): 'token' exp(log_ratio) per token; 'sequence' exp(sum of the row's log_ratio),
  one weight for all its tokens. A single threshold truncates (TIS: min(w, upper)); 'lower_upper' zeroes the
  weights outside [lower, upper] (IcePop).
- Rejection (``rollout_rs``, comma separated, all must pass): token_k1/k2/k3 per token; seq_sum_*, seq_mean_*
  (over the row's tokens) and seq_max_* (k2, k3) per row. k1 = -log_ratio, kept within [log lower, log upper]
  (a single threshold u means [1/u, u]); k2 = log_ratio^2 / 2 and k3 = exp(log_ratio) - 1 - log_ratio are kept
  at or below the threshold. A rejected token leaves the loss.
The log-ratio is clamped to [-20, 20] before any exp.
"""
import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

BOUND = 20.0
TRAINED_FRACTION = "rollout_corr/trained_token_fraction"
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


@dataclass(frozen=True)
class RejectRule:
    option: str                   # one of RS_OPTIONS
    upper: float
    lower: Optional[float] = None  # k1 options only: the ratio's lower bound


def _masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask > 0, values, 0.0).sum(dim=-1)


def _token_stats(log_ratio: torch.Tensor) -> Dict[str, torch.Tensor]:
    lr = log_ratio.clamp(-BOUND, BOUND)
    return {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.expm1(lr) - lr}


def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, upper: float,
               lower: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(weights, raw weights), both (B, T), 0 at padding: truncated at ``upper`` (TIS), or zero outside
    [lower, upper] when ``lower`` is given (IcePop)."""
    mask = mask.to(log_ratio.dtype)
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-BOUND, BOUND))
    elif level == "sequence":
        total = _masked_sum(log_ratio, mask).clamp(-BOUND, BOUND)
        raw = torch.exp(total).unsqueeze(-1).expand_as(log_ratio)
    else:
        raise ValueError(f"rollout_is must be 'token' or 'sequence', got {level!r}")
    raw = torch.where(mask > 0, raw, 0.0)
    if lower is None:
        return raw.clamp(max=upper), raw
    return torch.where((raw >= lower) & (raw <= upper), raw, 0.0), raw


def reject_keep(log_ratio: torch.Tensor, mask: torch.Tensor, rules) -> torch.Tensor:
    """Bool (B, T): real tokens that pass every rule."""
    real = mask > 0
    keep = real.clone()
    stats = _token_stats(log_ratio)
    count = real.sum(dim=-1).clamp(min=1)
    for rule in rules:
        scope, kind = rule.option.rsplit("_", 1)
        stat = stats[kind]
        if scope == "token":
            value = stat
        elif scope == "seq_sum":
            value = _masked_sum(stat, real).unsqueeze(-1)
        elif scope == "seq_mean":
            value = (_masked_sum(stat, real) / count).unsqueeze(-1)
        elif scope == "seq_max":
            value = torch.where(real, stat, -math.inf).amax(dim=-1).unsqueeze(-1)
        else:
            raise ValueError(f"rollout_rs option {rule.option!r} is not one of {list(RS_OPTIONS)}")
        if kind == "k1":
            passed = (value >= math.log(rule.lower)) & (value <= math.log(rule.upper))
        else:
            passed = value <= rule.upper
        keep &= passed.expand_as(keep)
    return keep


def correct(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor, spec
            ) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, float]]:
    """(IS weights, kept tokens, metrics) of a batch under ``spec`` (plan.rollout_correction
    .CorrectionSpec); weights are 1 where ``spec.rollout_is`` is None, every real token kept where it has
    no rejection rules. Metrics (``rollout_corr/...``): the weights' mean, max and min over real tokens, the
    fraction of tokens above / below the bounds (before truncation), the rejected token and row fractions, and
    (when the batch has real tokens) the fraction still trained on: kept with a non-zero weight."""
    if old_log_probs.shape != rollout_log_probs.shape or old_log_probs.shape != mask.shape:
        raise ValueError(f"rollout correction: old log-probs {tuple(old_log_probs.shape)}, rollout log-probs "
                         f"{tuple(rollout_log_probs.shape)} and mask {tuple(mask.shape)} must have one shape")
    log_ratio = (old_log_probs.double() - rollout_log_probs.double())
    real = mask > 0
    tokens = max(int(real.sum()), 1)
    rows = real.any(dim=-1)
    metrics: Dict[str, float] = {}
    if spec.rollout_is is not None:
        weights, raw = is_weights(log_ratio, real, spec.rollout_is, spec.is_upper, spec.is_lower)
        metrics["rollout_corr/rollout_is_mean"] = float(weights[real].sum()) / tokens
        metrics["rollout_corr/rollout_is_max"] = float(weights[real].max()) if real.any() else 0.0
        metrics["rollout_corr/rollout_is_min"] = float(weights[real].min()) if real.any() else 0.0
        high = raw > spec.is_upper
        low = raw < spec.is_lower if spec.is_lower is not None else torch.zeros_like(high)
        metrics["rollout_corr/rollout_is_ratio_fraction_high"] = float((high & real).sum()) / tokens
        metrics["rollout_corr/rollout_is_ratio_fraction_low"] = float((low & real).sum()) / tokens
    else:
        weights = real.to(torch.float64)
    keep = reject_keep(log_ratio, real, spec.rules) if spec.rules else real.clone()
    rejected = real & ~keep
    metrics["rollout_corr/rollout_rs_masked_fraction"] = float(rejected.sum()) / tokens
    metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = (float(rejected.any(dim=-1).sum())
                                                               / max(int(rows.sum()), 1))
    if real.any():  # tokens the policy gradient still sees: kept, with a non-zero weight
        metrics[TRAINED_FRACTION] = float((keep & (weights > 0)).sum()) / tokens
    return weights.float(), keep, metrics
