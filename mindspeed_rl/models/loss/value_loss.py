"""PPO critic loss as a pure tensor function: clipped value loss under the engine's gradient contract."""
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from mindspeed_rl.algorithms.masked import pad_rows

Rows = Union[Tensor, Sequence[Tensor]]


def _padded(x: Rows) -> Tuple[Tensor, Optional[Tensor]]:
    # list of per-row tensors -> (padded float tensor, mask); a tensor passes through
    if isinstance(x, Tensor):
        return x, None
    return pad_rows([r.float() for r in x], dtype=torch.float32)


def value_loss(vpreds: Rows, values: Rows, returns: Rows, mask: Optional[Tensor],
               cliprange_value: Optional[float], token_level: bool = True) -> Tuple[Tensor, Dict[str, float]]:
    """Clipped value loss SUMMED over the masked tokens, and its metrics.

    Per token: 0.5 * max((vpred - ret)^2, (clip(vpred, v - c, v + c) - ret)^2), v the rollout values and c
    ``cliprange_value`` (None: no clipping). The engine divides the sum by the global token count, so the
    gradient is that of the token mean over the whole mini-batch. With ``token_level=False`` each row's
    masked mean is summed instead (the engine then divides by the sequence count).

    vpreds (with grad), values, returns and mask are (rows, T) padded, or lists of per-row 1-D tensors
    (mask None: their lengths). Metrics: critic/vf_loss (the loss sum over this call's tokens, or rows,
    i.e. its own mean), critic/vf_clipfrac (masked token fraction where the clipped term is larger) and
    critic/vpred_mean.
    """
    vpreds, lengths_mask = _padded(vpreds)
    values = _padded(values)[0].to(vpreds.device)
    returns = _padded(returns)[0].to(vpreds.device)
    if mask is None:
        if lengths_mask is None:
            raise ValueError("mask is needed with padded tensors")
        mask = lengths_mask
    on = mask.to(vpreds.device) > 0
    # padded positions are zeroed first, so nothing there (NaN included) reaches the loss or the gradient
    vpreds = torch.where(on, vpreds.float(), 0.0)
    values = torch.where(on, values.float().detach(), 0.0)
    returns = torch.where(on, returns.float().detach(), 0.0)
    unclipped = (vpreds - returns).square()
    if cliprange_value is None:
        clipped = unclipped
    else:
        c = float(cliprange_value)
        clipped = (values + torch.clamp(vpreds - values, -c, c) - returns).square()
    per_token = 0.5 * torch.maximum(unclipped, clipped)
    per_token = torch.where(on, per_token, 0.0)
    counts = on.sum(dim=-1)
    tokens = int(counts.sum())
    if token_level:
        loss_sum = per_token.sum()
        denom = max(tokens, 1)
    else:
        loss_sum = (per_token.sum(dim=-1) / counts.clamp(min=1)).sum()
        denom = max(int((counts > 0).sum()), 1)
    with torch.no_grad():
        frac = (torch.where(on, clipped > unclipped, False).sum() / max(tokens, 1)) if tokens else 0.0
        vpred_mean = (vpreds.sum() / tokens) if tokens else 0.0
        metrics = {
            "critic/vf_loss": float(loss_sum.detach()) / denom,
            "critic/vf_clipfrac": float(frac),
            "critic/vpred_mean": float(vpred_mean),
        }
    return loss_sum, metrics
