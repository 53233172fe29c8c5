"""The driver's dock (DriverDock, no run plan) refuses bad puts and reads with a message naming what is
wrong, and a refused put writes nothing."""
import re

import pytest
import torch

from mindspeed_rl.data import driver_dock as transfer_dock
from mindspeed_rl.data.columnar import ColumnBatch, flatten_rows, value_rows
from mindspeed_rl.data.driver_dock import DriverDock


def _dock(prompts=2, n=3, **kwargs):
    return DriverDock(prompts, n, addition_columns=["responses", "response_length"], **kwargs)


def _status(dock):
    return {c: s.clone() for c, s in dock.experience_data_status.items()}


@pytest.mark.parametrize("prompts,n,name,value", [
    (0, 2, "prompts_num", "0"), (-1, 2, "prompts_num", "-1"), (2.0, 2, "prompts_num", "2.0"),
    (2, 0, "n_samples_per_prompt", "0"), (2, -3, "n_samples_per_prompt", "-3"),
    (2, "4", "n_samples_per_prompt", "'4'"),
])
def test_sizes_must_be_positive_ints_and_the_message_names_which(prompts, n, name, value):
    with pytest.raises(ValueError, match=rf"^transfer dock: {name} must be a positive int, got {value}$"):
        DriverDock(prompts, n)


def test_smallest_dock_holds_one_row():
    dock = DriverDock(1, 1)
    assert dock.max_len == 1
    dock.put_prompts_experience({"prompts": [torch.tensor([5, 6])]})
    assert dock.get_rows(["prompts"], [0])["prompts"][0].tolist() == [5, 6]


def test_columns_are_the_prompts_then_the_additions_without_repeats():
    dock = DriverDock(2, 2, addition_columns=["labels", "prompts", "labels", "extra"])
    assert dock.experience_columns == ["prompts", "prompt_length", "labels", "extra"]
    given = DriverDock(2, 2, addition_columns=["labels"], experience_columns=["responses", "responses", "labels"])
    assert given.experience_columns == ["responses", "labels"]  # given columns replace the defaults
    with pytest.raises(ValueError, match=r"unknown columns \['prompts'\]; the dock has \['responses', 'labels'\]"):
        given.put_experience({"prompts": [torch.ones(1)]}, [0])


def test_a_length_column_is_one_number_per_row_and_its_sums_are_read_from_one_tensor():
    dock = _dock()
    dock.put_experience({"response_length": torch.tensor([4, 0, 9]), "responses": [torch.ones(k) for k in (4, 0, 9)]},
                        [2, 0, 5])
    assert dock.experience_lengths["response_length"].tolist() == [0, 0, 4, 0, 0, 9]
    assert "responses" not in dock.experience_lengths  # a sequence column is no length column
    with pytest.raises(ValueError, match=r"^put experience: column 'response_length' needs one number per row, "
                                         r"row 1 has 2$"):
        dock.put_experience({"response_length": [torch.tensor([1]), torch.tensor([1, 2])]}, [3, 4])


@pytest.mark.parametrize("indexes,match", [
    (None, r"^put experience: indexes must be provided$"),
    ([], r"^put experience: indexes must be provided$"),
    ([[0, 1]], r"^put experience: indexes must be a flat list of row numbers$"),
    ([0, 6], r"^put experience: row 6 is outside the dock's range \[0, 6\)$"),
    ([-1], r"^put experience: row -1 is outside the dock's range \[0, 6\)$"),
    ([3, 1, 3], r"^put experience: indexes contain duplicate rows$"),
])
def test_a_put_at_bad_indexes_is_refused_and_writes_nothing(indexes, match):
    dock = _dock()
    before = _status(dock)
    rows = 2 if indexes is None or len(indexes) != 3 else 3
    data = {"responses": [torch.ones(2)] * rows, "response_length": [torch.tensor([2])] * rows}
    with pytest.raises(ValueError, match=match):
        dock.put_experience(data, indexes)
    assert all(torch.equal(before[c], dock.experience_data_status[c]) for c in before)


def test_the_last_row_is_inside_the_range():
    dock = _dock()
    dock.put_experience({"responses": [torch.tensor([7, 8])]}, [5])
    assert dock.get_rows(["responses"], [5])["responses"][0].tolist() == [7, 8]


@pytest.mark.parametrize("columns,indexes,match", [
    ([], [0], r"^get rows: no experience columns given$"),
    (["nope"], [0], r"^get rows: unknown columns \['nope'\]; the dock has "),
    (["responses"], [], r"^get rows: indexes must be a non-empty list of rows$"),
    (["responses"], None, r"^get rows: indexes must be a non-empty list of rows$"),
    (["responses"], [0, 0], r"^get rows: indexes contain duplicate rows$"),
    (["responses"], [6], r"^get rows: row 6 is outside"),
])
def test_a_bad_read_names_what_is_wrong(columns, indexes, match):
    dock = _dock()
    dock.put_experience({"responses": [torch.ones(1)] * 6}, list(range(6)))
    with pytest.raises(ValueError, match=match):
        dock.get_rows(columns, indexes)


def test_a_put_that_fails_on_one_column_writes_none_of_the_others():
    dock = _dock()
    good = [torch.ones(3), torch.ones(1)]
    with pytest.raises(ValueError, match=r"^put experience: column 'responses' has 2 rows but 3 indexes were given$"):
        dock.put_experience({"responses": good}, [0, 1, 2])
    # 'responses' passes its checks, 'response_length' fails its own: neither is written
    with pytest.raises(ValueError, match=r"^put experience: column 'response_length' needs one number per row"):
        dock.put_experience({"responses": good, "response_length": [torch.tensor([3]), torch.ones(2)]}, [0, 1])
    with pytest.raises(ValueError, match=r"^put experience: no experience columns given$"):
        dock.put_experience({}, [0])
    assert not any(bool(s.any()) for s in dock.experience_data_status.values())
    assert dock.experience_data["responses"][0] is None


def test_a_column_keeps_one_trailing_shape_and_a_refused_put_keeps_the_rows():
    dock = _dock()
    dock.put_experience({"responses": [torch.ones(2, 4), torch.ones(1, 4)]}, [0, 1])
    with pytest.raises(ValueError, match=r"^put experience: column 'responses': rows of trailing shape \(3,\) "):
        dock.put_experience({"responses": [torch.ones(2, 3)]}, [2])
    assert dock.experience_data_status["responses"].tolist() == [1, 1, 0, 0, 0, 0]
    assert [tuple(t.shape) for t in dock.get_rows(["responses"], [1, 0])["responses"]] == [(1, 4), (2, 4)]


def test_a_read_of_rows_never_put_names_the_column_and_at_most_16_rows():
    dock = DriverDock(10, 2, addition_columns=["responses"])
    dock.put_experience({"responses": [torch.ones(1)] * 2}, [0, 1])
    rows = list(range(20))
    missing = list(range(2, 18))
    want = f"transfer dock: get rows ['responses'] needs data that was never put: 'responses' rows {missing} ..."
    with pytest.raises(RuntimeError, match=f"^{re.escape(want)}$"):
        dock.get_rows(["responses"], rows)
    # 17 missing: the first 16 named, the rest left out
    with pytest.raises(RuntimeError, match=r"'responses' rows \[2, .*, 17\] \.\.\.$"):
        dock.get_rows(["responses"], rows[:19])
    # exactly 16 rows missing: all named, nothing left out
    with pytest.raises(RuntimeError, match=r"'responses' rows \[2, .*, 17\]$"):
        dock.get_rows(["responses"], rows[:18])
    # two columns: each named with its own rows
    with pytest.raises(RuntimeError, match=r"'prompts' rows \[0, 1, 2\]; 'responses' rows \[2\]$"):
        dock.get_rows(["prompts", "responses"], [0, 1, 2])


def test_prompts_are_put_n_times_each_with_their_length_and_listed_dataset_keys():
    dock = DriverDock(3, 2, addition_columns=["labels", "difficulty"])
    batch = {"prompts": [torch.tensor([1, 2, 3]), torch.tensor([4])],
             "labels": [torch.tensor([10]), torch.tensor([11])],
             "difficulty": [torch.tensor([0.5]), torch.tensor([0.7])]}
    # 'difficulty' is not listed: not put; 'missing' is listed but not in the batch: skipped
    dock.put_prompts_experience(batch, ["labels", "missing"])
    assert dock.experience_data_status["prompts"].tolist() == [1, 1, 1, 1, 0, 0]  # a short round: rows 0 .. 3
    got = dock.get_rows(["prompts", "prompt_length", "labels"], [0, 1, 2, 3])
    assert [t.tolist() for t in got["prompts"]] == [[1, 2, 3], [1, 2, 3], [4], [4]]
    assert [int(t) for t in got["prompt_length"]] == [3, 3, 1, 1]
    assert [int(t) for t in got["labels"]] == [10, 10, 11, 11]
    assert not bool(dock.experience_data_status["difficulty"].any())


@pytest.mark.parametrize("batch,match", [
    ({"labels": [torch.ones(1)]}, r"^put prompts: the batch has no 'prompts'$"),
    ({"prompts": []}, r"^put prompts: 0 prompts x 2 samples do not fit the dock's 6 rows$"),
    ({"prompts": [torch.ones(1)] * 4}, r"^put prompts: 4 prompts x 2 samples do not fit the dock's 6 rows$"),
    ({"prompts": [torch.ones(1)] * 3, "labels": [torch.ones(1)] * 2},
     r"^put prompts: 'labels' has 2 rows, prompts have 3$"),
])
def test_bad_prompts_are_refused_and_nothing_is_put(batch, match):
    dock = DriverDock(3, 2, addition_columns=["labels"])
    with pytest.raises(ValueError, match=match):
        dock.put_prompts_experience(batch, ["labels"])
    assert not any(bool(s.any()) for s in dock.experience_data_status.values())


def test_all_prompts_fill_the_dock():
    dock = DriverDock(3, 2)
    dock.put_prompts_experience({"prompts": [torch.ones(k) for k in (1, 2, 3)]})
    assert bool((dock.experience_data_status["prompts"] == 1).all())


def test_upstream_names_resolve_from_the_compat_package_at_upstreams_path_only():
    from mindspeed_rl.compat import transfer_dock as compat
    from mindspeed_rl.trainer.utils import transfer_dock as face
    assert face.TransferDock is compat.TransferDock and face.GRPOTransferDock is compat.GRPOTransferDock
    assert face.DriverDock is transfer_dock.DriverDock
    with pytest.raises(AttributeError, match=r"^module 'mindspeed_rl.trainer.utils.transfer_dock' has no "
                                             r"attribute 'NoSuchDock'$"):
        face.NoSuchDock  # noqa: B018
    assert not hasattr(transfer_dock, "GRPOTransferDock")  # the core's dock module knows nothing of compat


def test_group_rows_are_row_indexes_even_for_no_groups():
    rows = torch.arange(12) * 10
    assert rows[transfer_dock.group_rows([2, 0], 3)].tolist() == [60, 70, 80, 0, 10, 20]
    assert rows[transfer_dock.group_rows([], 3)].tolist() == []  # an empty selection still indexes


def test_a_batch_of_buffers_is_checked_column_by_column_against_the_indexes():
    """A rank's result arrives as a ColumnBatch of flat buffers (through Ray): it is taken as it is,
    each column's row count checked against the indexes; a short column is refused by name."""
    dock = _dock()
    shipped = ColumnBatch(flat={"responses": flatten_rows("responses", [torch.ones(2), torch.ones(3)]),
                                "response_length": value_rows(torch.tensor([2]))})
    with pytest.raises(ValueError, match=r"^put experience: column 'response_length' has 1 rows but 2 indexes "
                                         r"were given$"):
        dock.put_experience(shipped, [0, 1])
    assert not any(bool(s.any()) for s in dock.experience_data_status.values())
