"""Columnar storage of the dock and its one-buffer-per-column transport."""
import pickle

import pytest
import torch

from mindspeed_rl.trainer.utils.columnar import ColumnBatch, ColumnStore, pack


def _rows(seed=0, n=6):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 100, (int(torch.randint(0, 9, (1,), generator=g)),), generator=g) for _ in range(n)]


def test_pickled_batch_travels_as_one_buffer_per_column_and_unpacks_to_views():
    rows = _rows()
    batch = ColumnBatch({"responses": rows, "scores": [torch.tensor(float(i)) for i in range(6)],
                         "logp": [torch.randn(len(r), dtype=torch.bfloat16) for r in rows],
                         "mask": [torch.ones(2, 3, dtype=torch.bool) for _ in rows]})
    wire = pickle.dumps(batch, protocol=5)
    back = pickle.loads(wire)
    assert isinstance(back, ColumnBatch) and list(back) == list(batch)
    for key in batch:
        assert len(back[key]) == 6
        for a, b in zip(batch[key], back[key]):
            assert a.dtype == b.dtype and torch.equal(a, b)
    # every row of a column is a view of one received buffer
    ptrs = {r.untyped_storage().data_ptr() for r in back["responses"] if r.numel()}
    assert len(ptrs) == 1
    # one buffer per column: the pickle holds no per-row tensor objects
    assert wire.count(b"torch._utils") == 0


def test_store_put_get_overwrite_and_compaction():
    store = ColumnStore(8)
    rows = _rows(1, 8)
    store.put(torch.arange(8), pack("c", rows))
    for _ in range(5):  # overwrite rows again and again: garbage gets compacted
        fresh = _rows(2, 4)
        store.put(torch.tensor([1, 3, 5, 7]), pack("c", fresh))
        rows[1], rows[3], rows[5], rows[7] = fresh
    flat, lengths = store.get(torch.tensor([7, 0, 3]))
    assert torch.equal(flat, torch.cat([rows[7], rows[0], rows[3]]))
    assert lengths.tolist() == [len(rows[7]), len(rows[0]), len(rows[3])]
    assert all(torch.equal(store[i], rows[i]) for i in range(8))
    assert store._data.numel() <= 4 * sum(r.numel() for r in rows) + 1024  # compaction bounds the buffer
    store.clear_rows(torch.tensor([2]))
    assert store[2] is None
    with pytest.raises(KeyError, match=r"\[2\]"):
        store.get(torch.tensor([2]))


def test_shapes_and_dtypes():
    store = ColumnStore(4)
    store.put(torch.tensor([0, 1]), pack("x", [torch.ones(2, 3), torch.zeros(1, 3)]))
    assert store[1].shape == (1, 3) and store[0].shape == (2, 3)
    with pytest.raises(ValueError, match="trailing shape"):
        store.check("x", pack("x", [torch.ones(2, 4)]))
    with pytest.raises(ValueError, match="row 1"):
        pack("x", [torch.ones(2, 3), torch.ones(2, 4)])
    ints = ColumnStore(2)
    ints.put(torch.tensor([0]), pack("n", [torch.tensor([1], dtype=torch.int32)]))
    ints.put(torch.tensor([1]), pack("n", [torch.tensor([2.5])]))  # a float row promotes the column
    assert ints[0].dtype == torch.float32 and float(ints[1][0]) == 2.5
