"""Columnar rows (columnar.py), the parts the other columnar tests leave open: when a ColumnStore's buffer is
grown or compacted and what that keeps, the messages naming rows without a value, lengths and dtypes of
unpadded and padded rows, batches of zero rows and bad rows through pickling, and batches received from
read-only buffers (what Ray hands back)."""
import pickle
import warnings

import pytest
import torch

from mindspeed_rl.data.columnar import (ColumnBatch, ColumnStore, LengthStore, flatten_rows,
                                                 unpadded_rows, value_rows)


def _put(store, row, values):
    store.put(torch.tensor([row]), flatten_rows("c", [values]))


def _buffer(view):
    """(address, size in elements) of the buffer a row handed out by a store lives in."""
    storage = view.untyped_storage()
    return storage.data_ptr(), storage.nbytes() // view.element_size()


# ------------------------------------------------------------------ rows without a value


def test_rows_without_a_value_are_named_in_order_and_at_most_eight():
    store = ColumnStore(12)
    store.put(torch.tensor([1, 4]), flatten_rows("c", [torch.ones(2), torch.ones(3)]))
    with pytest.raises(KeyError, match=r"^'rows \[2\] hold no value'$"):
        store.views(torch.tensor([1, 2, 4]))
    # present rows are skipped; of the missing ones the first eight are named, in the order asked
    asked = torch.tensor([11, 1, 0, 4, 2, 3, 5, 6, 7, 8, 9, 10])
    with pytest.raises(KeyError, match=r"^'rows \[11, 0, 2, 3, 5, 6, 7, 8\] hold no value'$"):
        store.views(asked)
    with pytest.raises(KeyError, match=r"^'rows \[11, 0, 2, 3, 5, 6, 7, 8\] hold no value'$"):
        store.gather(asked)
    lengths = LengthStore(12)
    lengths.put(torch.tensor([1, 4]), value_rows(torch.tensor([5, 6])))
    with pytest.raises(KeyError, match=r"^'rows \[11, 0, 2, 3, 5, 6, 7, 8\] hold no value'$"):
        lengths.gather(asked)
    with pytest.raises(KeyError, match=r"^'rows \[11, 0, 2, 3, 5, 6, 7, 8\] hold no value'$"):
        lengths.views(asked)
    # a refused read changes nothing
    assert [v.tolist() for v in store.views(torch.tensor([4, 1]))] == [[1.0] * 3, [1.0] * 2]


# ------------------------------------------------------------------ growing and compacting the buffer


def test_rows_stay_in_place_while_the_buffer_has_room_and_a_full_one_mostly_garbage_is_compacted():
    store = ColumnStore(2)
    kept = torch.arange(300)
    _put(store, 0, kept)
    _put(store, 1, torch.arange(500))  # 800 of the first buffer's 1024 elements
    before = store[0]  # a row handed out keeps its buffer alive (so its address is not reused)
    first = _buffer(before)
    assert first[1] == 1024
    # overwriting row 1 leaves 500 elements of garbage (more than half), but the write fits: nothing moves
    _put(store, 1, torch.arange(100))
    assert _buffer(store[0]) == first
    # the next write does not fit: the garbage is dropped instead of growing the buffer
    _put(store, 1, torch.arange(1000, 1200))
    moved = _buffer(store[0])
    assert moved[0] != first[0] and moved[1] == 1024
    assert torch.equal(store[0], kept) and store[1].tolist() == list(range(1000, 1200))


def test_a_row_longer_than_the_room_left_after_compaction_grows_the_buffer():
    store = ColumnStore(2)
    _put(store, 0, torch.arange(100))
    _put(store, 1, torch.arange(500))
    _put(store, 1, torch.arange(400))  # 1000 used, 500 of them garbage
    long_row = torch.arange(5000, 6000)  # the 100 kept + 1000 new: more than the 1024 even after compaction
    _put(store, 1, long_row)
    assert _buffer(store[1])[1] >= 1100
    assert store[0].tolist() == list(range(100)) and torch.equal(store[1], long_row)


def test_a_growing_buffer_keeps_the_columns_dtype_and_exact_values():
    big = 2 ** 40 + 1  # not exact as a float32
    store = ColumnStore(3)
    _put(store, 0, torch.tensor([big, -big], dtype=torch.int64))
    _put(store, 1, torch.full((3000,), big, dtype=torch.int64))  # past the first buffer
    _put(store, 2, torch.tensor([7], dtype=torch.int64))
    assert all(store[r].dtype == torch.int64 for r in range(3))
    assert store[0].tolist() == [big, -big] and store[1].tolist() == [big] * 3000 and store[2].tolist() == [7]
    flat, _, _ = store.gather(torch.tensor([2, 0]))
    assert flat.dtype == torch.int64 and flat.tolist() == [7, big, -big]
    halves = ColumnStore(2)  # a narrow dtype too: bfloat16 stays bfloat16
    _put(halves, 0, torch.tensor([1.5], dtype=torch.bfloat16))
    _put(halves, 1, torch.full((2000,), -2.0, dtype=torch.bfloat16))
    assert halves[0].dtype == torch.bfloat16 and halves[1].dtype == torch.bfloat16 and halves[0].tolist() == [1.5]


def test_the_buffer_doubles_as_it_grows_so_many_appends_make_few_buffers():
    store = ColumnStore(200)
    buffers = set()
    held = []  # the views keep each buffer alive, so no address is reused
    for row in range(200):
        _put(store, row, torch.full((100,), row))
        held.append(store[row])
        buffers.add(_buffer(held[-1])[0])
    # 20000 elements from a first buffer of 1024: 1024, 2048, ..., 32768 is six buffers
    assert len(buffers) == 6
    assert all(torch.equal(store[r], torch.full((100,), r)) for r in range(200))


# ------------------------------------------------------------------ unpadded and padded rows


def test_unpadded_rows_give_int64_lengths_whatever_type_the_lengths_come_in():
    padded = torch.tensor([[1, 2, 3], [4, 5, 0]], dtype=torch.int32)
    mask = (padded != 0).float()  # an attention mask's sum is a float count
    for lengths in (mask.sum(-1), torch.tensor([3, 2], dtype=torch.int32), [3, 2]):
        flat, got, trailing = unpadded_rows(padded, lengths)
        assert got.dtype == torch.int64 and got.tolist() == [3, 2] and trailing == ()
        assert flat.dtype == torch.int32 and flat.tolist() == [1, 2, 3, 4, 5]
    batch = ColumnBatch(flat={"ids": unpadded_rows(padded, mask.sum(-1))})
    assert [r.tolist() for r in batch["ids"]] == [[1, 2, 3], [4, 5]]


def test_padded_rows_are_cast_to_the_dtype_asked():
    batch = ColumnBatch({"ids": [torch.tensor([1, 2, 3]), torch.tensor([4])]})
    got = batch.padded("ids", [1, 0])
    assert got.dtype == torch.float32 and got.tolist() == [[4.0, 0.0, 0.0], [1.0, 2.0, 3.0]]
    got = batch.padded("ids", [0], dtype=torch.int32)
    assert got.dtype == torch.int32 and got.tolist() == [[1, 2, 3]]


# ------------------------------------------------------------------ comparing, pickling


def test_a_batch_from_buffers_compares_by_its_rows_with_eq_and_ne():
    def fresh():
        return ColumnBatch(flat={"x": value_rows(torch.tensor([1.0, 2.0]))})

    same = {"x": [torch.tensor([1.0]), torch.tensor([2.0])]}
    other = {"x": [torch.tensor([1.0]), torch.tensor([3.0])]}
    assert not (fresh() != same) and fresh() == same  # noqa: SIM202  (!= is what is tested)
    assert fresh() != other and not (fresh() == other)
    assert fresh() != {"x": same["x"], "y": []}


def test_pickling_a_batch_with_a_bad_row_names_its_column():
    batch = ColumnBatch({"ids": [torch.tensor([1, 2]), [3]]})
    with pytest.raises(ValueError, match=r"^column 'ids' row 1: expected a tensor, got list$"):
        pickle.dumps(batch)


def test_a_share_of_no_rows_keeps_its_columns_dtype_and_row_shape_through_pickling():
    rows = [torch.arange(6, dtype=torch.int32).view(2, 3), torch.arange(3, dtype=torch.int32).view(1, 3)]
    batch = ColumnBatch(flat={"m": flatten_rows("m", rows)})
    empty = pickle.loads(pickle.dumps(batch.take(1, 1, ["m"])))
    flat, lengths, trailing = empty.flat["m"]
    assert flat.dtype == torch.int32 and flat.numel() == 0 and lengths.numel() == 0 and trailing == (3,)
    assert empty["m"] == []
    # so it can be written back beside the column's other rows
    store = ColumnStore(2)
    store.put(torch.tensor([0]), flatten_rows("m", rows[:1]))
    store.check("m", empty.flat["m"])


def test_a_batch_received_from_read_only_buffers_arrives_intact_and_without_a_warning():
    batch = ColumnBatch({"ids": [torch.tensor([1, 2]), torch.tensor([3])],
                         "bf": [torch.tensor([1.5], dtype=torch.bfloat16)]})
    buffers = []
    wire = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    read_only = [memoryview(bytes(b.raw())) for b in buffers]  # as Ray hands them back
    # torch warns about a read-only array only once per process unless told to warn always
    warn_always = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            back = pickle.loads(wire, buffers=read_only)
    finally:
        torch.set_warn_always(warn_always)
    assert [str(w.message) for w in caught] == []
    assert [r.tolist() for r in back["ids"]] == [[1, 2], [3]] and back["bf"][0].tolist() == [1.5]
    assert back["bf"][0].dtype == torch.bfloat16
