"""Columnar storage of the dock and its one-buffer-per-column transport."""
import pickle

import pytest
import torch

from mindspeed_rl.data.columnar import ColumnBatch, ColumnStore, flatten_rows
from mindspeed_rl.utils.token_ids import token_ids


def _rows(seed=0, n=6):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 100, (int(torch.randint(0, 9, (1,), generator=g)),), generator=g) for _ in range(n)]


def test_pickled_batch_travels_as_one_buffer_per_column_and_arrives_as_views():
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


def test_store_put_get_overwrite_and_clear_rows():
    store = ColumnStore(8)
    rows = _rows(1, 8)
    store.put(torch.arange(8), flatten_rows("c", rows))
    for _ in range(5):
        fresh = _rows(2, 4)
        store.put(torch.tensor([1, 3, 5, 7]), flatten_rows("c", fresh))
        rows[1], rows[3], rows[5], rows[7] = fresh
    flat, lengths, _ = store.gather(torch.tensor([7, 0, 3]))
    assert torch.equal(flat, torch.cat([rows[7], rows[0], rows[3]]))
    assert lengths.tolist() == [len(rows[7]), len(rows[0]), len(rows[3])]
    assert all(torch.equal(store[i], rows[i]) for i in range(8))
    store.clear_rows(torch.tensor([2]))
    assert store[2] is None
    with pytest.raises(KeyError, match=r"\[2\]"):
        store.gather(torch.tensor([2]))


def _capacity(store, row):
    """Elements the store's buffer holds (the storage behind a row's view)."""
    view = store[row]
    return view.untyped_storage().nbytes() // view.element_size()


@pytest.mark.parametrize("trailing", [(), (3,)])
def test_compaction_runs_and_keeps_every_live_row_readable(trailing):
    """Overwrites leave garbage; once the buffer is full and mostly garbage it is
    compacted: the buffer stays far smaller than all values ever written, every
    live row reads back its latest value, and rows handed out before keep theirs."""
    g = torch.Generator().manual_seed(0)

    def row(length):
        return torch.randint(0, 1 << 20, (length, *trailing), generator=g)

    store = ColumnStore(8)
    latest = [row(100) for _ in range(8)]
    store.put(torch.arange(8), flatten_rows("c", latest))
    written = sum(r.numel() for r in latest)
    held = {i: (store.views(torch.tensor([i]))[0], latest[i].clone()) for i in (0, 2, 4, 6)}
    for k in range(40):  # lengths change, so compaction moves the kept rows
        fresh = [row(50 + k) for _ in range(4)]
        store.put(torch.tensor([1, 3, 5, 7]), flatten_rows("c", fresh))
        written += sum(r.numel() for r in fresh)
        latest[1], latest[3], latest[5], latest[7] = fresh
        # read between writes: held views must not see any later move
        assert all(torch.equal(store[i], latest[i]) for i in range(8)), f"after write {k}"
    live = sum(r.numel() for r in latest)
    assert written > 4 * _capacity(store, 0)  # without compaction the buffer holds everything written
    assert _capacity(store, 0) <= 4 * live
    # every row is a view of the one current buffer (no old buffer kept alive by the store)
    assert len({store[i].untyped_storage().data_ptr() for i in range(8)}) == 1
    assert all(torch.equal(a, b) for a, b in zip(store.views(torch.arange(8)), latest))
    flat, lengths, _ = store.gather(torch.tensor([7, 0, 3]))
    assert torch.equal(flat, torch.cat([latest[7].reshape(-1), latest[0].reshape(-1), latest[3].reshape(-1)]))
    assert lengths.tolist() == [latest[7].shape[0], 100, latest[3].shape[0]]
    for i, (view, value) in held.items():
        assert torch.equal(view, value), f"row {i} handed out before compaction changed"


def test_token_ids_above_int16_range_survive_store_and_transport():
    wide = [torch.tensor([0, 32767, 32768, 65535, 65536, 151643, 2**31 - 1]), torch.tensor([151645])]
    for ids in (wide, [token_ids(t) for t in wide]):  # as given, and as the dataset and the rollout give them
        part = flatten_rows("ids", ids)
        assert part[0].dtype == ids[0].dtype  # stored in the dtype given: nothing narrows or widens them
        store = ColumnStore(2)
        store.put(torch.arange(2), part)
        assert [r.tolist() for r in store.views(torch.arange(2))] == [t.tolist() for t in wide]
        back = pickle.loads(pickle.dumps(ColumnBatch({"ids": ids}), protocol=5))
        assert [r.tolist() for r in back["ids"]] == [t.tolist() for t in wide]
        assert back.flat["ids"][0].dtype == ids[0].dtype


def test_shapes_and_dtypes():
    store = ColumnStore(4)
    store.put(torch.tensor([0, 1]), flatten_rows("x", [torch.ones(2, 3), torch.zeros(1, 3)]))
    assert store[1].shape == (1, 3) and store[0].shape == (2, 3)
    with pytest.raises(ValueError, match="trailing shape"):
        store.check("x", flatten_rows("x", [torch.ones(2, 4)]))
    with pytest.raises(ValueError, match="row 1"):
        flatten_rows("x", [torch.ones(2, 3), torch.ones(2, 4)])
    ints = ColumnStore(2)
    ints.put(torch.tensor([0]), flatten_rows("n", [torch.tensor([1], dtype=torch.int32)]))
    ints.put(torch.tensor([1]), flatten_rows("n", [torch.tensor([2.5])]))  # a float row promotes the column
    assert ints[0].dtype == torch.float32 and float(ints[1][0]) == 2.5


# ------------------------------------------------------------------ one batch format


def test_a_length_column_is_stored_once_and_served_as_rows():
    from mindspeed_rl.data.columnar import LengthStore
    from mindspeed_rl.data.driver_dock import DriverDock
    dock = DriverDock(2, 2, experience_columns=["prompts", "prompt_length", "response_length"])
    dock.put_prompts_experience({"prompts": [torch.ones(3, dtype=torch.int32), torch.ones(5, dtype=torch.int32)]})
    store = dock.experience_data["prompt_length"]
    assert isinstance(store, LengthStore) and dock.experience_lengths["prompt_length"] is store.values
    assert store.values.tolist() == [3, 3, 5, 5]
    rows = dock.get_rows(["prompt_length"], [3, 0])
    assert [r.tolist() for r in rows["prompt_length"]] == [[5], [3]]
    with pytest.raises(ValueError, match="'response_length' needs one number per row, row 1 has 2"):
        dock.put_experience({"response_length": [torch.tensor([1]), torch.tensor([1, 2])]}, [0, 1])
    assert store.values.tolist() == [3, 3, 5, 5] and dock.experience_data_status["response_length"].sum() == 0


def test_a_batch_from_buffers_makes_row_views_only_when_read():
    from mindspeed_rl.data.columnar import tensor_rows, value_rows
    adv = torch.tensor([0.5, -1.0, 2.0, 4.0])
    lp = [torch.tensor([-1.0, -2.0]), torch.tensor([-3.0]), torch.tensor([-4.0, -5.0, -6.0]), torch.tensor([-7.0])]
    batch = ColumnBatch(flat={"advantages": value_rows(adv), "old": flatten_rows("old", lp),
                              "ids": tensor_rows("ids", torch.arange(8, dtype=torch.int32).view(4, 2))})
    assert dict.__len__(batch) == 0 and len(batch) == 3 and "old" in batch and list(batch) == ["advantages", "old", "ids"]
    # one value per row: one index into the buffer, no per-row tensors made
    assert batch.padded("advantages", [3, 1]).tolist() == [[4.0], [-1.0]] and dict.__len__(batch) == 0
    assert batch.padded("old", [2, 1]).tolist() == [[-4.0, -5.0, -6.0], [-3.0, 0.0, 0.0]]
    share = batch.take(1, 3, ["advantages", "old"])  # a share: views of the same buffers
    assert share.flat["old"][0].data_ptr() == batch.flat["old"][0].data_ptr() + 2 * 4
    assert [r.tolist() for r in share["old"]] == [[-3.0], [-4.0, -5.0, -6.0]]
    assert share.padded("advantages", [1]).tolist() == [[2.0]] and list(share) == ["advantages", "old"]
    back = pickle.loads(pickle.dumps(share))
    assert [r.tolist() for r in back["old"]] == [[-3.0], [-4.0, -5.0, -6.0]]
    assert [r.tolist() for r in batch["ids"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_masked_gives_the_padded_values_and_where_each_row_has_them():
    from mindspeed_rl.data.columnar import value_rows
    lp = [torch.tensor([-1.0, -2.0]), torch.tensor([-3.0]), torch.tensor([-4.0, -5.0, -6.0])]
    batch = ColumnBatch(flat={"old": flatten_rows("old", lp), "adv": value_rows(torch.tensor([1.0, 2.0, 3.0]))})
    values, mask = batch.masked("old", [2, 1])
    assert values.tolist() == [[-4.0, -5.0, -6.0], [-3.0, 0.0, 0.0]]
    assert mask.dtype == torch.bool and mask.tolist() == [[True, True, True], [True, False, False]]
    values, mask = batch.masked("adv", [2, 0])  # one value per row
    assert values.tolist() == [[3.0], [1.0]] and mask.tolist() == [[True], [True]] and mask.dtype == torch.bool
    values, mask = batch.masked("adv", [])  # no rows: an empty selection still indexes
    assert values.shape == (0, 1) and mask.shape == (0, 1)
    listed = ColumnBatch({"old": lp})  # rows as tensors, not buffers: the same answer
    assert [t.tolist() for t in listed.masked("old", [0, 1])] == [[[-1.0, -2.0], [-3.0, 0.0]],
                                                                  [[True, True], [True, False]]]
