"""Columnar experience: storage and one-buffer-per-column transport.

A column's rows travel and rest *flattened*: ``FlatRows`` is (every row's
values in one flat buffer, per-row first-dim lengths, the rows' trailing
shape). This is not sequence packing (models/packing.py): nothing is padded or
cut, the rows are only laid end to end.

``ColumnStore`` keeps one column of the dock: the flat buffer of the column's
dtype, with per-row start and length. ``ColumnBatch`` is the dict of per-row
tensors the dock hands out and takes; pickled (through Ray) it travels as one
numpy buffer plus lengths per column, and the receiver gets per-row tensors
that are views of the received buffer (read-only when Ray maps them from its
object store).
"""
import warnings
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

# (flat values, per-row first-dim lengths, trailing shape or None for 0-d rows)
FlatRows = Tuple[Tensor, Tensor, Optional[Tuple[int, ...]]]
_VIEW_AS = {torch.bfloat16: torch.int16}  # dtypes numpy lacks travel as same-width ints


def _row_layout(column: str, values: List[Tensor]) -> Tuple[Optional[Tuple[int, ...]], torch.dtype]:
    """Trailing shape (None: 0-d rows) and common dtype of ``values``; ValueError naming the row."""
    for row, value in enumerate(values):
        if not isinstance(value, Tensor):
            raise ValueError(f"column '{column}' row {row}: expected a tensor, got {type(value).__name__}")
    first = values[0]
    trailing = None if first.dim() == 0 else tuple(first.shape[1:])
    shapes = {None if v.dim() == 0 else tuple(v.shape[1:]) for v in values}
    if len(shapes) > 1:
        row = next(i for i, v in enumerate(values) if (None if v.dim() == 0 else tuple(v.shape[1:])) != trailing)
        raise ValueError(f"column '{column}' row {row}: shape {tuple(values[row].shape)} does not match "
                         f"the other rows' trailing shape {trailing}")
    dtypes = {v.dtype for v in values}
    dtype = dtypes.pop()
    for other in dtypes:
        dtype = torch.promote_types(dtype, other)
    return trailing, dtype


def flatten_rows(column: str, values: List[Tensor]) -> FlatRows:
    """Rows -> (flat buffer, first-dim lengths, trailing shape)."""
    if not values:
        return torch.empty(0), torch.empty(0, dtype=torch.int64), ()
    trailing, dtype = _row_layout(column, values)
    lengths = torch.tensor([1 if v.dim() == 0 else v.shape[0] for v in values], dtype=torch.int64)
    if trailing == () and all(v.dtype == dtype for v in values):
        flat = torch.cat(values)  # 1-D rows of one dtype: one copy
    else:
        flat = torch.cat([v.reshape(-1).to(dtype) for v in values])
    return flat, lengths, trailing


def tensor_rows(column: str, value: Tensor) -> FlatRows:
    """A tensor with a row per first-dim entry (a (rows,) tensor: one value per row; (rows, width):
    rows of ``width`` items) as FlatRows, without making per-row tensors."""
    if value.dim() == 0:
        raise ValueError(f"column '{column}': a 0-d tensor has no rows")
    n = value.shape[0]
    if value.dim() == 1:
        return value, torch.ones(n, dtype=torch.int64), None
    return value.reshape(-1), torch.full((n,), value.shape[1], dtype=torch.int64), tuple(value.shape[2:])


def value_rows(values: Tensor) -> FlatRows:
    """One value per row as rows of shape (1,) (what a rank's one-number results look like)."""
    flat = values.reshape(-1)
    return flat, torch.ones(flat.numel(), dtype=torch.int64), ()


def unpadded_rows(padded: Tensor, lengths) -> FlatRows:
    """Row i's first ``lengths[i]`` items of a right-padded (rows, width) tensor (one masked select)."""
    lengths = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
    if lengths.numel() != padded.shape[0]:
        raise ValueError(f"{lengths.numel()} lengths for {padded.shape[0]} rows")
    mask = torch.arange(padded.shape[1], device=padded.device) < lengths.to(padded.device)[:, None]
    return padded[mask].cpu(), lengths, ()


def slice_rows(part: FlatRows, start: int, stop: int) -> FlatRows:
    """Rows ``start`` .. ``stop``-1 of ``part`` (a view of its buffer)."""
    flat, lengths, trailing = part
    width = int(np.prod(trailing)) if trailing else 1
    first = int(lengths[:start].sum()) * width
    size = int(lengths[start:stop].sum()) * width
    return flat[first:first + size], lengths[start:stop], trailing


def row_views(flat: Tensor, lengths: Tensor, trailing: Optional[Tuple[int, ...]]) -> List[Tensor]:
    """Per-row views of ``flat``."""
    if trailing is None:
        return list(flat.unbind(0)) if flat.numel() else []
    if not trailing:  # 1-D rows: the split pieces are the rows
        return list(torch.split(flat, lengths.tolist()))
    width = int(np.prod(trailing))
    rows = torch.split(flat, (lengths * width).tolist())
    return [r.view(-1, *trailing) for r in rows]


class ColumnBatch(dict):
    """Column name -> list of per-row tensors; pickles as one buffer per column.
    ``flat``: the columns' FlatRows when built from them (a gather, a driver
    stage's tensors, or received through Ray), so a writer takes the buffers as
    they are; None otherwise. Built from FlatRows, a column's per-row views are
    made when the column is first read as rows (a batch that only travels, or is
    only indexed through ``padded``, never makes them)."""

    def __init__(self, data=None, flat: Dict[str, FlatRows] = None):
        super().__init__({} if flat is not None else (data or {}))
        self.flat = flat

    def __missing__(self, key):
        if self.flat is None or key not in self.flat:
            raise KeyError(key)
        rows = row_views(*self.flat[key])
        dict.__setitem__(self, key, rows)
        return rows

    def _all(self):
        if self.flat is not None and dict.__len__(self) < len(self.flat):
            for key in self.flat:
                self[key]  # noqa: B018  (makes the column's views)

    def __contains__(self, key):
        return key in self.flat if self.flat is not None else dict.__contains__(self, key)

    def __len__(self):
        return len(self.flat) if self.flat is not None else dict.__len__(self)

    def __iter__(self):
        return iter(self.flat) if self.flat is not None else dict.__iter__(self)

    def keys(self):
        return self.flat.keys() if self.flat is not None else dict.keys(self)

    def items(self):
        self._all()
        return dict.items(self)

    def values(self):
        self._all()
        return dict.values(self)

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __eq__(self, other):
        self._all()
        return dict.__eq__(self, other)

    def __ne__(self, other):  # dict's own != reads only the views made so far
        self._all()
        return dict.__ne__(self, other)

    __hash__ = None

    def __repr__(self):
        self._all()
        return dict.__repr__(self)

    def take(self, start: int, stop: int, columns) -> "ColumnBatch":
        """Rows ``start`` .. ``stop``-1 of ``columns`` (views: the flat buffers are sliced, not copied)."""
        if self.flat is None:
            return ColumnBatch({c: self[c][start:stop] for c in columns})
        return ColumnBatch(flat={c: slice_rows(self.flat[c], start, stop) for c in columns})

    def padded(self, column: str, idx, dtype=torch.float32) -> Tensor:
        """Rows ``idx`` of ``column`` right-padded with zeros into (len(idx), longest row)."""
        return self.masked(column, idx, dtype)[0]

    def masked(self, column: str, idx, dtype=torch.float32) -> Tuple[Tensor, Tensor]:
        """Rows ``idx`` of ``column`` as (values right-padded with zeros, bool mask: True on each row's values);
        one index into the flat buffer when every row holds one value (no per-row tensors made)."""
        part = self.flat.get(column) if self.flat is not None else None
        if part is not None and not part[2] and bool((part[1] == 1).all()):
            values = part[0][torch.as_tensor(idx, dtype=torch.int64)].to(dtype).view(-1, 1)
            return values, torch.ones(values.shape, dtype=torch.bool)
        rows = [self[column][i].to(dtype).reshape(-1) for i in idx]
        values = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        lengths = torch.tensor([r.numel() for r in rows], dtype=torch.int64)
        return values, torch.arange(values.shape[1])[None, :] < lengths[:, None]

    def __reduce__(self):
        flat_columns = self.flat if self.flat is not None else {k: flatten_rows(k, list(v)) for k, v in self.items()}
        wire = {}
        for key, (flat, lengths, trailing) in flat_columns.items():
            view = _VIEW_AS.get(flat.dtype)
            array = (flat.view(view) if view is not None else flat).contiguous().numpy()
            wire[key] = (array, str(flat.dtype), lengths.numpy(), trailing)
        return _rebuild, (wire,)


def cpu_batch(output: Dict[str, List[Tensor]]) -> ColumnBatch:
    """Results as the dock takes them: detached CPU tensors, one buffer per column through Ray."""
    return ColumnBatch({k: [t.detach().cpu() for t in v] for k, v in output.items()})


def _rebuild(wire) -> ColumnBatch:
    columns = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Ray hands back read-only arrays
        for key, (array, dtype, lengths, trailing) in wire.items():
            flat = torch.from_numpy(array)
            dtype = getattr(torch, dtype.split(".")[-1])
            if flat.dtype != dtype:
                flat = flat.view(dtype)
            columns[key] = (flat, torch.from_numpy(np.asarray(lengths)), trailing)
    return ColumnBatch(flat=columns)


class LengthStore:
    """A dock column of one count per row (a length): one int64 tensor (``values``), the one copy the
    planner's vectorised sums read; handed out as rows of shape (1,)."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.values = torch.zeros(max_len, dtype=torch.int64)
        self._has = torch.zeros(max_len, dtype=torch.bool)

    def clear(self):
        self.values.zero_()
        self._has.zero_()

    @staticmethod
    def check(column: str, part: FlatRows):
        """Raise ValueError unless every row of ``part`` is one number (nothing written)."""
        _, lengths, trailing = part
        sizes = lengths * (int(np.prod(trailing)) if trailing else 1)
        if bool((sizes != 1).any()):
            row = int((sizes != 1).nonzero()[0, 0])
            raise ValueError(f"column '{column}' needs one number per row, row {row} has {int(sizes[row])}")

    def put(self, rows: Tensor, part: FlatRows):
        self.values[rows] = part[0].reshape(-1).to(torch.int64)
        self._has[rows] = True

    def clear_rows(self, rows: Tensor):
        self._has[rows] = False

    def _missing(self, rows: Tensor):
        if not bool(self._has[rows].all()):
            raise KeyError(f"rows {rows[~self._has[rows]][:8].tolist()} hold no value")

    def gather(self, rows: Tensor) -> FlatRows:
        self._missing(rows)
        return self.values[rows], torch.ones(rows.numel(), dtype=torch.int64), ()

    def views(self, rows: Tensor) -> List[Tensor]:
        self._missing(rows)
        return [self.values[r:r + 1] for r in rows.tolist()]

    def __getitem__(self, row: int) -> Optional[Tensor]:
        row = int(row)
        return self.values[row:row + 1] if bool(self._has[row]) else None

    def __len__(self) -> int:
        return self.max_len

    def __iter__(self):
        return (self[r] for r in range(self.max_len))


class ColumnStore:
    """One dock column: rows' values in one growing flat buffer."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.clear()

    def clear(self):
        self._data: Optional[Tensor] = None
        self._used = 0
        self._trailing: Optional[Tuple[int, ...]] = ()
        self._start = torch.zeros(self.max_len, dtype=torch.int64)
        self._len = torch.full((self.max_len,), -1, dtype=torch.int64)  # -1: no value
        self._live = 0  # elements referenced by rows; the rest is garbage from overwrites

    def check(self, column: str, part: FlatRows):
        """Raise ValueError if ``part``'s rows cannot join this column (nothing written)."""
        _, _, trailing = part
        if self._data is not None and self._live and trailing != self._trailing:
            raise ValueError(f"column '{column}': rows of trailing shape {trailing} cannot join rows of "
                             f"shape {self._trailing}")

    def put(self, rows: Tensor, part: FlatRows):
        flat, lengths, trailing = part
        width = int(np.prod(trailing)) if trailing else 1
        sizes = lengths * width
        self.clear_rows(rows)
        if self._data is None or not self._live:
            self._data, self._used, self._trailing = None, 0, trailing
        self._ensure(flat)
        starts = self._used + torch.cumsum(sizes, 0) - sizes
        self._data[self._used:self._used + flat.numel()] = flat
        self._start[rows], self._len[rows] = starts, lengths
        self._used += flat.numel()
        self._live += int(sizes.sum())

    def _view(self, row: int) -> Optional[Tensor]:
        """Row ``row`` as a view of the buffer (no copy; made when asked for), None without a value.
        A view handed out keeps its values when the buffer later grows or is compacted (a new buffer)."""
        n = int(self._len[row])
        if n < 0:
            return None
        start = int(self._start[row])
        piece = self._data[start:start + n * self._width()]
        return piece if self._trailing == () else (
            piece[0] if self._trailing is None else piece.view(-1, *self._trailing))

    def views(self, rows: Tensor) -> List[Tensor]:
        """The stored rows (views, no copy); KeyError for rows without a value."""
        out = [self._view(r) for r in rows.tolist()]
        if any(v is None for v in out):
            missing = [r for r, v in zip(rows.tolist(), out) if v is None]
            raise KeyError(f"rows {missing[:8]} hold no value")
        return out

    def _ensure(self, flat: Tensor):
        need = self._used + flat.numel()
        if self._data is None:
            self._data = torch.empty(max(need, 1024), dtype=flat.dtype)
            return
        dtype = torch.promote_types(self._data.dtype, flat.dtype)
        if need > self._data.numel() and self._live < self._used // 2:
            self._compact()
            need = self._used + flat.numel()
        if need > self._data.numel() or dtype != self._data.dtype:
            grown = torch.empty(max(need, 2 * self._data.numel()), dtype=dtype)
            grown[:self._used] = self._data[:self._used]
            self._data = grown

    def _compact(self):
        """Drop the values of overwritten rows (kept rows move to the front)."""
        rows = (self._len >= 0).nonzero(as_tuple=True)[0]
        flat, lengths, _ = self.gather(rows)
        # into a new buffer: rows handed out earlier are views of the old one and keep their values
        self._data = torch.empty_like(self._data)
        self._data[:flat.numel()] = flat
        width = self._width()
        sizes = lengths * width
        self._start[rows] = torch.cumsum(sizes, 0) - sizes
        self._used = flat.numel()

    def _width(self) -> int:
        return int(np.prod(self._trailing)) if self._trailing else 1

    def clear_rows(self, rows: Tensor):
        present = rows[self._len[rows] >= 0]
        self._live -= int((self._len[present] * self._width()).sum())
        self._len[present] = -1

    def gather(self, rows: Tensor) -> FlatRows:
        """``rows`` in order as one flat buffer (a copy), with their first-dim lengths and trailing shape."""
        lengths = self._len[rows]
        if bool((lengths < 0).any()):
            raise KeyError(f"rows {rows[lengths < 0][:8].tolist()} hold no value")
        sizes = lengths * self._width()
        total = int(sizes.sum())
        if total >= 64 * rows.numel():  # long rows: one memcpy per row beats an index gather
            starts = self._start[rows].tolist()
            return torch.cat([self._data[a:a + n] for a, n in zip(starts, sizes.tolist())]), lengths, self._trailing
        # numpy: torch's threaded repeat_interleave costs ~1 ms on small inputs
        offsets = (self._start[rows] - (torch.cumsum(sizes, 0) - sizes)).numpy()
        index = torch.from_numpy(np.repeat(offsets, sizes.numpy()) + np.arange(total))
        return self._data[index], lengths, self._trailing

    def __getitem__(self, row: int) -> Optional[Tensor]:
        return self._view(int(row))

    def __len__(self) -> int:
        return self.max_len

    def __iter__(self):
        return (self[r] for r in range(self.max_len))
