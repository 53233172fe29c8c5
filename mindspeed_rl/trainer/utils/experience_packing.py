# coding=utf-8
"""Helpers that turn experience columns into rows, padded batches and packed buffers."""
from typing import Dict, List, Tuple, Union

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence

# Columns holding one number per row (a length).
LENGTH_COLUMNS = ("prompt_length", "response_length", "input_ids_length")
NO_MULTIPLE_COLUMNS = ("position_ids",)


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


def _pad_rows(rows: List[Tensor], pad_value, multiple: int) -> Tensor:
    # pad along the last dim; rows may be 1-D (L,) or 2-D (C, L)
    padded = pad_sequence([r.movedim(-1, 0) for r in rows], batch_first=True,
                          padding_value=pad_value).movedim(1, -1)
    length = padded.size(-1)
    target = -(-length // multiple) * multiple
    if target != length:
        padded = F.pad(padded, (0, target - length), value=pad_value)
    return padded


def _pad_column(key: str, rows: List[Tensor], pad_id, multiple: int) -> Tensor:
    if not rows:
        raise ValueError(f"column '{key}' has no rows to pad")
    if key in LENGTH_COLUMNS:
        return torch.cat([r.reshape(-1) for r in rows]).reshape(-1, 1)
    if key in NO_MULTIPLE_COLUMNS:
        return _pad_rows(rows, pad_id, 1)
    pad_value = 0.0 if rows[0].is_floating_point() else pad_id
    return _pad_rows(rows, pad_value, multiple)


def _check_multiple(multiple) -> None:
    if not isinstance(multiple, int) or isinstance(multiple, bool) or multiple < 1:
        raise ValueError(f"multiple must be a positive int, got {multiple!r}")


def pad_experience(experience_batch: Dict[str, List[Tensor]], pad_id, multiple: int = 1) -> Dict[str, Tensor]:
    """Right-pad each column's rows into one tensor whose length is a multiple of `multiple`."""
    if not experience_batch:
        raise ValueError("pad_experience got an empty experience_batch")
    _check_multiple(multiple)
    return {key: _pad_column(key, rows, pad_id, multiple) for key, rows in experience_batch.items()}


def pack_experience_columns(
        experience_dict: Dict[str, List[Tensor]], experience_count: int
) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
    """Concatenate each column's rows along the last dim; also return the int32 row lengths."""
    if not experience_dict:
        raise ValueError("pack_experience_columns got an empty experience_dict")
    batch_data, batch_data_length = {}, {}
    for key, rows in experience_dict.items():
        if len(rows) != experience_count:
            raise ValueError(
                f"column '{key}' has {len(rows)} rows, expected experience_count={experience_count}")
        if experience_count == 0:
            raise ValueError(f"column '{key}' has no rows to pack")
        rows = [r.reshape(1) if r.dim() == 0 else r for r in rows]
        ndim = rows[0].dim()
        if ndim > 2 or any(r.dim() != ndim for r in rows):
            raise ValueError(f"column '{key}': rows must all be 1-D or all be 2-D")
        if ndim == 2 and any(r.shape[0] != rows[0].shape[0] for r in rows):
            raise ValueError(f"column '{key}': 2-D rows must share the same first dimension")
        batch_data[key] = torch.cat(rows, dim=-1).to(rows[0].dtype)
        batch_data_length[key] = torch.tensor([r.shape[-1] for r in rows], dtype=torch.int32)
    return batch_data, batch_data_length


def unpack_pad_experience(
        batch_data: Dict[str, Tensor], batch_data_length: Dict[str, Tensor], pad_id, multiple: int
) -> Dict[str, Tensor]:
    """Undo pack_experience_columns and pad the rows exactly as pad_experience does."""
    if not batch_data:
        raise ValueError("unpack_pad_experience got an empty batch_data")
    if set(batch_data) != set(batch_data_length):
        raise ValueError(
            f"keys of batch_data {sorted(batch_data)} and batch_data_length "
            f"{sorted(batch_data_length)} do not match")
    _check_multiple(multiple)
    padded = {}
    for key, data in batch_data.items():
        sizes = torch.as_tensor(batch_data_length[key]).reshape(-1).tolist()
        if sum(sizes) != data.shape[-1]:
            raise ValueError(
                f"column '{key}': lengths sum to {sum(sizes)} but packed data has {data.shape[-1]}")
        rows = list(torch.split(data, sizes, dim=-1))
        padded[key] = _pad_column(key, rows, pad_id, multiple)
    return padded
