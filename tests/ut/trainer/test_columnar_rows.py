"""Columnar rows (columnar.py) piece by piece: how rows are laid flat and cut back, what a refused row is
told, ColumnBatch's dict surface, LengthStore and the ColumnStore paths the dock's tests do not reach."""
import pickle

import pytest
import torch

from mindspeed_rl.data.columnar import (ColumnBatch, ColumnStore, LengthStore, cpu_batch, flatten_rows,
                                                 row_views, slice_rows, tensor_rows, unpadded_rows, value_rows)


def test_a_row_that_is_no_tensor_or_of_another_shape_is_named():
    with pytest.raises(ValueError, match=r"^column 'c' row 1: expected a tensor, got list$"):
        flatten_rows("c", [torch.ones(1), [1.0]])
    with pytest.raises(ValueError, match=r"^column 'c' row 2: shape \(2, 2\) does not match the other rows' "
                                         r"trailing shape \(3,\)$"):
        flatten_rows("c", [torch.ones(1, 3), torch.ones(4, 3), torch.ones(2, 2)])
    # a 0-d row among 1-d rows: no common layout
    with pytest.raises(ValueError, match=r"^column 'c' row 1: shape \(\) does not match the other rows' trailing "
                                         r"shape \(\)$"):
        flatten_rows("c", [torch.ones(2), torch.tensor(1.0)])


def test_rows_are_laid_end_to_end_in_their_common_dtype():
    flat, lengths, trailing = flatten_rows("c", [torch.tensor([1, 2], dtype=torch.int32), torch.tensor([3])])
    assert flat.dtype == torch.int64 and flat.tolist() == [1, 2, 3]  # int32 and int64: int64
    assert lengths.dtype == torch.int64 and lengths.tolist() == [2, 1] and trailing == ()
    flat, lengths, trailing = flatten_rows("c", [torch.tensor([1], dtype=torch.int32), torch.tensor([0.5, 2.0])])
    assert flat.dtype == torch.float32 and flat.tolist() == [1.0, 0.5, 2.0]
    flat, lengths, trailing = flatten_rows("c", [torch.tensor(1.5), torch.tensor(2.5)])  # 0-d rows
    assert flat.tolist() == [1.5, 2.5] and lengths.tolist() == [1, 1] and trailing is None
    flat, lengths, trailing = flatten_rows("c", [torch.arange(6).view(2, 3), torch.arange(3).view(1, 3)])
    assert flat.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2] and lengths.tolist() == [2, 1] and trailing == (3,)
    flat, lengths, trailing = flatten_rows("c", [])
    assert flat.numel() == 0 and lengths.dtype == torch.int64 and lengths.numel() == 0 and trailing == ()


def test_a_tensor_of_rows_becomes_flat_rows_without_a_copy_per_row():
    with pytest.raises(ValueError, match=r"^column 'x': a 0-d tensor has no rows$"):
        tensor_rows("x", torch.tensor(3.0))
    flat, lengths, trailing = tensor_rows("x", torch.tensor([4.0, 5.0, 6.0]))
    assert flat.tolist() == [4.0, 5.0, 6.0] and lengths.tolist() == [1, 1, 1] and trailing is None
    assert lengths.dtype == torch.int64
    flat, lengths, trailing = tensor_rows("x", torch.arange(6).view(2, 3))
    assert flat.tolist() == list(range(6)) and lengths.tolist() == [3, 3] and trailing == ()
    flat, lengths, trailing = tensor_rows("x", torch.arange(12).view(2, 3, 2))
    assert flat.numel() == 12 and lengths.tolist() == [3, 3] and trailing == (2,)
    assert [r.shape for r in row_views(flat, lengths, trailing)] == [(3, 2), (3, 2)]
    flat, lengths, trailing = value_rows(torch.tensor([[1.0], [2.0]]))
    assert flat.tolist() == [1.0, 2.0] and lengths.tolist() == [1, 1] and trailing == ()
    assert lengths.dtype == torch.int64


def test_unpadded_rows_keep_each_rows_first_items():
    padded = torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0]])
    flat, lengths, trailing = unpadded_rows(padded, [3, 1, 2])
    assert flat.tolist() == [1, 2, 3, 4, 5, 6] and lengths.tolist() == [3, 1, 2] and trailing == ()
    assert lengths.dtype == torch.int64
    flat, lengths, _ = unpadded_rows(padded, torch.tensor([[0], [3], [1]]))  # lengths of any shape, flattened
    assert flat.tolist() == [4, 0, 0, 5] and lengths.tolist() == [0, 3, 1]
    with pytest.raises(ValueError, match=r"^2 lengths for 3 rows$"):
        unpadded_rows(padded, [1, 2])


def test_slices_and_views_of_flat_rows():
    part = flatten_rows("c", [torch.arange(4).view(2, 2), torch.arange(4, 6).view(1, 2), torch.arange(6, 12).view(3, 2)])
    flat, lengths, trailing = slice_rows(part, 1, 3)
    assert flat.tolist() == list(range(4, 12)) and lengths.tolist() == [1, 3] and trailing == (2,)
    flat, lengths, trailing = slice_rows(flatten_rows("c", [torch.ones(2), torch.zeros(3), torch.ones(1)]), 1, 2)
    assert flat.tolist() == [0.0, 0.0, 0.0] and lengths.tolist() == [3]
    flat, lengths, trailing = slice_rows(flatten_rows("c", [torch.tensor(1.0), torch.tensor(2.0)]), 1, 2)
    assert flat.tolist() == [2.0]
    assert row_views(torch.empty(0), torch.empty(0, dtype=torch.int64), None) == []
    views = row_views(torch.tensor([7.0, 8.0]), torch.tensor([1, 1]), None)
    assert [v.dim() for v in views] == [0, 0] and [float(v) for v in views] == [7.0, 8.0]


def test_a_batch_is_a_dict_of_rows_whether_built_from_rows_or_from_buffers():
    rows = {"a": [torch.tensor([1, 2]), torch.tensor([3])], "b": [torch.tensor([0.5]), torch.tensor([1.5])]}
    plain = ColumnBatch(rows)
    flat = ColumnBatch(flat={k: flatten_rows(k, v) for k, v in rows.items()})
    for batch in (plain, flat):
        assert len(batch) == 2 and list(batch) == ["a", "b"] and list(batch.keys()) == ["a", "b"]
        assert "a" in batch and "z" not in batch
        assert batch.get("z") is None and batch.get("z", 5) == 5
        assert [t.tolist() for t in batch.get("a")] == [[1, 2], [3]]
        with pytest.raises(KeyError, match="z"):
            batch["z"]  # noqa: B018
        assert [k for k, _ in batch.items()] == ["a", "b"]
        assert [[t.tolist() for t in v] for v in batch.values()] == [[[1, 2], [3]], [[0.5], [1.5]]]
        assert "'a': [tensor([1, 2]), tensor([3])]" in repr(batch)
        taken = batch.take(1, 2, ["a"])
        assert list(taken) == ["a"] and [t.tolist() for t in taken["a"]] == [[3]]
        assert batch.padded("a", [1, 0]).tolist() == [[3.0, 0.0], [1.0, 2.0]]
        assert batch.padded("a", [0], dtype=torch.int64).dtype == torch.int64
    same = ColumnBatch(flat={"x": value_rows(torch.tensor([1.0]))})
    assert same == {"x": [torch.tensor([1.0])]} and same != {"x": [torch.tensor([1.0])], "y": []}
    with pytest.raises(TypeError):
        hash(same)


def test_padded_one_value_rows_in_the_dtype_asked():
    batch = ColumnBatch(flat={"adv": value_rows(torch.tensor([1.5, -2.0, 3.0]))})
    got = batch.padded("adv", [2, 0], dtype=torch.float64)
    assert got.dtype == torch.float64 and got.tolist() == [[3.0], [1.5]]
    # one value per row but 2-D rows of width 1: padded the general way, same numbers
    wide = ColumnBatch(flat={"w": tensor_rows("w", torch.tensor([[1.0], [2.0]]))})
    assert wide.padded("w", [1, 0]).tolist() == [[2.0], [1.0]]


def test_cpu_batch_detaches_its_rows_and_a_bfloat16_column_travels():
    t = torch.ones(2, requires_grad=True) * 2
    batch = cpu_batch({"lp": [t], "bf": [torch.tensor([1.5, -2.0], dtype=torch.bfloat16)]})
    assert isinstance(batch, ColumnBatch) and not batch["lp"][0].requires_grad
    back = pickle.loads(pickle.dumps(batch))
    assert back["bf"][0].dtype == torch.bfloat16 and back["bf"][0].tolist() == [1.5, -2.0]
    assert back["lp"][0].tolist() == [2.0, 2.0]


def test_a_length_store_holds_one_count_per_row():
    store = LengthStore(4)
    assert len(store) == 4 and list(store) == [None] * 4
    LengthStore.check("n", (torch.tensor([1, 2]), torch.tensor([1, 1]), ()))
    LengthStore.check("n", (torch.tensor([1, 2]), torch.tensor([1, 1]), None))
    with pytest.raises(ValueError, match=r"^column 'n' needs one number per row, row 0 has 2$"):
        LengthStore.check("n", (torch.ones(2), torch.tensor([1]), (2,)))
    with pytest.raises(ValueError, match=r"^column 'n' needs one number per row, row 1 has 0$"):
        LengthStore.check("n", (torch.ones(1), torch.tensor([1, 0]), ()))
    store.put(torch.tensor([2, 0]), (torch.tensor([7.9, 3.0]), torch.ones(2, dtype=torch.int64), ()))
    assert store.values.tolist() == [3, 0, 7, 0] and store.values.dtype == torch.int64
    assert [None if v is None else v.tolist() for v in store] == [[3], None, [7], None]
    assert [v.tolist() for v in store.views(torch.tensor([2, 0]))] == [[7], [3]]
    flat, lengths, trailing = store.gather(torch.tensor([0, 2]))
    assert flat.tolist() == [3, 7] and lengths.tolist() == [1, 1] and trailing == ()
    with pytest.raises(KeyError, match=r"rows \[1, 3\] hold no value"):
        store.gather(torch.tensor([0, 1, 3]))
    with pytest.raises(KeyError, match=r"rows \[1\] hold no value"):
        store.views(torch.tensor([1]))
    store.clear_rows(torch.tensor([2]))
    assert store[2] is None and store[0].tolist() == [3]
    store.clear()
    assert store.values.tolist() == [0, 0, 0, 0] and store[0] is None


def test_an_empty_store_or_one_whose_rows_are_all_cleared_takes_a_new_shape():
    store = ColumnStore(3)
    assert len(store) == 3 and list(store) == [None, None, None]
    store.check("c", flatten_rows("c", [torch.ones(1, 5)]))  # nothing stored yet: any shape
    store.put(torch.tensor([0, 1]), flatten_rows("c", [torch.ones(1, 2), torch.ones(2, 2)]))
    with pytest.raises(ValueError, match=r"^column 'c': rows of trailing shape \(5,\) cannot join rows of shape "
                                         r"\(2,\)$"):
        store.check("c", flatten_rows("c", [torch.ones(1, 5)]))
    store.clear_rows(torch.tensor([0]))
    with pytest.raises(ValueError, match="cannot join"):  # row 1 still holds values
        store.check("c", flatten_rows("c", [torch.ones(1, 5)]))
    store.clear_rows(torch.tensor([1, 2]))  # row 2 never held a value: nothing to clear there
    store.check("c", flatten_rows("c", [torch.ones(1, 5)]))
    store.put(torch.tensor([2]), flatten_rows("c", [torch.arange(5.0).view(1, 5)]))
    assert store[2].tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0]] and store[0] is None
    scalars = ColumnStore(2)
    scalars.put(torch.tensor([1, 0]), flatten_rows("s", [torch.tensor(4.0), torch.tensor(5.0)]))
    assert scalars[0].dim() == 0 and [float(scalars[0]), float(scalars[1])] == [5.0, 4.0]


def test_a_store_grows_past_its_first_buffer_and_keeps_every_row():
    store = ColumnStore(4)
    small = [torch.arange(3)]
    store.put(torch.tensor([0]), flatten_rows("c", small))
    big = [torch.arange(1000, 3000), torch.arange(5000, 5600)]  # past the first 1024 elements
    store.put(torch.tensor([1, 2]), flatten_rows("c", big))
    assert store[0].tolist() == [0, 1, 2]
    assert torch.equal(store[1], big[0]) and torch.equal(store[2], big[1])
    store.put(torch.tensor([3]), flatten_rows("c", [torch.tensor([0.5])]))  # a float row: the column turns float
    assert store[1].dtype == torch.float32 and store[1][:3].tolist() == [1000.0, 1001.0, 1002.0]
    assert store[3].tolist() == [0.5]


@pytest.mark.parametrize("length", [1, 63, 64, 200])
def test_gather_gives_the_rows_in_order_for_short_and_long_rows(length):
    """Short rows are gathered with one index, long ones piece by piece: the same rows either way."""
    rows = [torch.arange(i * 1000, i * 1000 + length + i) for i in range(5)]
    store = ColumnStore(5)
    store.put(torch.arange(5), flatten_rows("c", rows))
    store.put(torch.tensor([2]), flatten_rows("c", [torch.arange(-length, 0)]))  # an overwrite: not in order
    rows[2] = torch.arange(-length, 0)
    flat, lengths, trailing = store.gather(torch.tensor([4, 2, 0]))
    assert flat.tolist() == torch.cat([rows[4], rows[2], rows[0]]).tolist()
    assert lengths.tolist() == [length + 4, length, length] and trailing == ()
    wide = ColumnStore(3)
    wide.put(torch.arange(3), flatten_rows("w", [torch.full((length, 2), float(i)) for i in range(3)]))
    flat, lengths, trailing = wide.gather(torch.tensor([2, 1]))
    assert flat.tolist() == [2.0] * (2 * length) + [1.0] * (2 * length) and trailing == (2,)


def test_a_row_of_no_items_is_a_value_not_a_gap():
    """An empty response (0 tokens) is stored, read back and cleared like any other row."""
    store = ColumnStore(3)
    store.put(torch.tensor([0, 1]), flatten_rows("c", [torch.ones(0), torch.tensor([4.0, 5.0])]))
    flat, lengths, _ = store.gather(torch.tensor([0, 1]))
    assert flat.tolist() == [4.0, 5.0] and lengths.tolist() == [0, 2]
    assert [v.tolist() for v in store.views(torch.tensor([1, 0]))] == [[4.0, 5.0], []]
    with pytest.raises(KeyError, match=r"rows \[2\] hold no value"):
        store.gather(torch.tensor([0, 2]))
    store.clear_rows(torch.tensor([0]))
    assert store[0] is None and store[1].tolist() == [4.0, 5.0]
    with pytest.raises(KeyError, match=r"rows \[0\] hold no value"):
        store.gather(torch.tensor([0]))


def test_unpadded_rows_count_the_rows_not_the_width():
    padded = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match=r"^3 lengths for 2 rows$"):
        unpadded_rows(padded, [1, 1, 1])
    flat, lengths, _ = unpadded_rows(padded, [0, 3])
    assert flat.tolist() == [4, 5, 6]
