"""Masked statistics over right-padded (rows, max_len) tensors, and padding of per-row lists.

Padding never leaks into results: padded positions of every output are 0 and no statistic counts them.
"""
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

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


def as_lengths(response_length) -> Tensor:
    if isinstance(response_length, Tensor):
        return response_length.reshape(-1).long()
    return torch.tensor([int(n) for n in response_length], dtype=torch.long)


def float_mask(mask: Tensor, like: Tensor) -> Tensor:
    return mask.to(device=like.device, dtype=torch.float32)


def masked_mean(x: Tensor, mask: Tensor, dim: Optional[int] = None) -> Tensor:
    """Mean of x over the positions where mask is set (over all of them, or along ``dim``); 0 where none is."""
    m = float_mask(mask, x)
    total = torch.where(m > 0, x.float() * m, 0.0)  # where(): non-finite padding cannot leak
    if dim is None:
        count = m.sum()
        return torch.where(count > 0, total.sum() / count.clamp(min=1e-12), torch.zeros_like(count))
    count = m.sum(dim=dim)
    return torch.where(count > 0, total.sum(dim=dim) / count.clamp(min=1e-12), torch.zeros_like(count))


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of x over the masked positions (Bessel-corrected when ``unbiased`` and more than one)."""
    m = float_mask(mask, x)
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
    m = float_mask(mask, x)
    mean = masked_mean(x, m)
    white = (x.float() - mean) * torch.rsqrt(masked_var(x, m) + WHITEN_EPS)
    if not shift_mean:
        white = white + mean
    return torch.where(m > 0, white, 0.0)
