# coding=utf-8
"""Upstream's experience input -> the dock's per-row lists.

Upstream code puts a column either as one tensor with a row per first-dim
entry (e.g. a padded 2-D batch) or as a list of per-row tensors; the dock
stores per-row tensors. ``trans_input_to_experience`` (upstream's name) turns
either into (column names, one list of row tensors per column)."""
from typing import Dict, List, Tuple, Union

import torch
from torch import Tensor


def _narrow(t: Tensor) -> Tensor:
    return t.to(torch.int32) if t.dtype == torch.int64 else t


def trans_input_to_experience(
        experience_dict: Dict[str, Union[Tensor, List[Tensor], None]]
) -> Tuple[List[str], List[List[Tensor]]]:
    """Split a column dict into column names and per-column row lists (int64 narrowed to int32)."""
    columns, lists = [], []
    for key, value in experience_dict.items():
        if value is None:
            continue
        if isinstance(value, Tensor) and value.dim() > 0:
            rows = list(torch.unbind(_narrow(value), dim=0))
        elif isinstance(value, list) and all(isinstance(v, Tensor) for v in value):
            rows = [_narrow(v) for v in value]
        else:
            raise ValueError(f"column '{key}': unsupported value type {type(value).__name__}")
        columns.append(key)
        lists.append(rows)
    for key, rows in zip(columns, lists):
        if len(rows) != len(lists[0]):
            raise ValueError(
                f"column '{key}' has {len(rows)} rows, but '{columns[0]}' has {len(lists[0])}")
    return columns, lists
