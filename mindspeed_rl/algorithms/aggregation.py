"""How per-token losses become one number (verl's loss_agg_mode), over a mini-batch cut into pieces.

A loss is sum(per_token * token_weights) / denominator. The weights are local to a row; the denominator
counts the whole mini-batch (all micro-batches and DP ranks), so the pieces' gradients add up to the
full batch's. ``horizon`` is seq-mean-token-sum-norm's constant length (Dr.GRPO: the max response tokens).
"""
from typing import Optional, Sequence

import torch
from torch import Tensor

from mindspeed_rl.algorithms.registry import did_you_mean
from mindspeed_rl.algorithms.spec import AGG_MODES


def check_mode(mode: str) -> str:
    if mode not in AGG_MODES:
        raise ValueError(f"rl_config.loss_agg_mode={mode!r} is not one of {list(AGG_MODES)}"
                         f"{did_you_mean(mode, AGG_MODES)}")
    return mode


def token_weights(mask: Tensor, mode: str) -> Tensor:
    """(rows, T): 1 on kept tokens; seq-mean-token-mean: 1 / the row's kept tokens (each row weighs the same)."""
    mask = mask.float()
    if check_mode(mode) == "seq-mean-token-mean":
        return mask / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    return mask


def denominator(kept: Sequence[float], mode: str, horizon: Optional[float] = None) -> float:
    """What the summed loss of rows with ``kept`` tokens each is divided by: the tokens (token-mean), the
    rows with any token (seq-mean-*), times ``horizon`` for seq-mean-token-sum-norm."""
    kept = [float(k) for k in kept]  # a fractional mask counts its weights
    if check_mode(mode) == "token-mean":
        return float(sum(kept))
    rows = float(sum(k > 0 for k in kept))
    if mode == "seq-mean-token-sum-norm":
        if horizon is None or horizon <= 0:
            raise ValueError(f"loss_agg_mode seq-mean-token-sum-norm needs a positive horizon, got {horizon}")
        return rows * float(horizon)
    return rows


def agg_loss(loss_mat: Tensor, mask: Tensor, mode: str, denom=None, horizon: Optional[float] = None) -> Tensor:
    """sum(loss * weights) / denom (default: this call's own ``denominator``; at least 1 token or row)."""
    weights = token_weights(mask, mode)
    if denom is None:
        lengths = (mask.float().sum(dim=-1)).tolist()
        denom = max(denominator(lengths, mode, horizon if horizon is not None else mask.shape[-1]), 1.0)
    elif float(denom) <= 0:
        raise ValueError(f"token_count must be positive, got {denom}")
    # where() rather than a product, so non-finite values at padded positions cannot leak in
    return torch.where(weights > 0, loss_mat * weights, 0.0).sum() / denom
