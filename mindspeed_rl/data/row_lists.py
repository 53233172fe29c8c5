# coding=utf-8
"""Experience as callers put it -> the dock's columns.

A column is given either as one tensor with a row per first-dim entry (a
(rows,) tensor of one value per row, a padded 2-D batch) or as a list of
per-row tensors. ``column_parts`` turns either into one ``FlatRows`` per
column (a tensor without making per-row tensors); ``trans_input_to_experience``
(upstream's name) gives per-row lists. Values keep their dtype: token ids are
int32 from the dataset and the rollout, and the engine widens them on the device."""
from typing import Dict, List, Tuple, Union

from torch import Tensor

from mindspeed_rl.data.columnar import FlatRows, flatten_rows, tensor_rows

Columns = Dict[str, Union[Tensor, List[Tensor], None]]


def _given(experience_dict: Columns):
    """(column, value) pairs that hold rows (None skipped); ValueError naming a column of another type."""
    for key, value in experience_dict.items():
        if value is None:
            continue
        if isinstance(value, Tensor) and value.dim() > 0:
            yield key, value
        elif isinstance(value, list) and all(isinstance(v, Tensor) for v in value):
            yield key, value
        else:
            raise ValueError(f"column '{key}': unsupported value type {type(value).__name__}")


def _same_row_counts(counts: Dict[str, int]) -> None:
    first = next(iter(counts), None)
    for key, n in counts.items():
        if n != counts[first]:
            raise ValueError(f"column '{key}' has {n} rows, but '{first}' has {counts[first]}")


def column_parts(experience_dict: Columns) -> Tuple[List[str], List[FlatRows]]:
    """Column names and one FlatRows per column."""
    columns, parts = [], []
    for key, value in _given(experience_dict):
        columns.append(key)
        parts.append(tensor_rows(key, value) if isinstance(value, Tensor) else flatten_rows(key, value))
    _same_row_counts({c: p[1].numel() for c, p in zip(columns, parts)})
    return columns, parts


def trans_input_to_experience(experience_dict: Columns) -> Tuple[List[str], List[List[Tensor]]]:
    """Column names and per-column row lists (a tensor split along its first dimension)."""
    columns, lists = [], []
    for key, value in _given(experience_dict):
        columns.append(key)
        lists.append(list(value))  # a tensor gives its rows along the first dimension
    _same_row_counts(dict(zip(columns, map(len, lists))))
    return columns, lists
