"""Upstream's TransferDock low-level calls `_put`/`_get` (its own unit tests use them): rows written by index,
read back in the order asked, a read that waits for a row another thread writes, and refusals that write nothing."""
import threading

import pytest
import torch

from mindspeed_rl.compat.transfer_dock import TransferDock


def _dock(timeout=10.0, interval=0.01, columns=("default", "other")):
    return TransferDock(prompts_num=16, n_samples_per_prompt=1, experience_columns=list(columns),
                        timeout=timeout, timeout_interval=interval)


def test_put_writes_each_value_at_its_row_and_get_reads_them_in_the_order_asked():
    td = _dock()
    rows = [11, 2, 7, 5]
    values = [[torch.full((1, 8), float(r)) for r in rows], [torch.arange(r + 1) for r in rows]]
    td._put(["default", "other"], values, indexes=rows)
    for i, row in enumerate(rows):
        assert torch.equal(td.experience_data["default"][row], values[0][i])
        assert torch.equal(td.experience_data["other"][row], values[1][i])
    assert td.experience_data_status["default"].nonzero().flatten().tolist() == sorted(rows)
    got = td._get(["other", "default"], [5, 11])
    assert [t.tolist() for t in got[0]] == [list(range(6)), list(range(12))]
    assert [float(t[0, 0]) for t in got[1]] == [5.0, 11.0]
    assert td._get(["default", "other"], []) == [[], []]


def test_get_waits_for_a_row_another_thread_puts():
    td = _dock(timeout=120.0)
    td._put(["default"], [[torch.tensor([1.0])]], indexes=[0])
    waiting, seen = threading.Event(), []
    check = td._missing

    def missing(columns, rows):  # the reader's poll: row 3 is put only once the reader has found it missing
        found = check(columns, rows)
        seen.append(found)
        if found:
            waiting.set()
        return found
    td._missing = missing

    def late():
        assert waiting.wait(120)
        td._put(["default"], [[torch.tensor([3.0])]], indexes=[3])
    writer = threading.Thread(target=late)
    writer.start()
    got = td._get(["default"], [3, 0])
    writer.join()
    assert [t.tolist() for t in got[0]] == [[3.0], [1.0]]
    assert seen[0] == {"default": [3]} and seen[-1] == {}


def test_get_of_a_row_never_put_times_out_naming_it():
    td = _dock(timeout=0.05)
    td._put(["default"], [[torch.tensor([1.0])]], indexes=[0])
    with pytest.raises(TimeoutError, match=r"'default' rows \[4\]"):
        td._get(["default"], [0, 4])


@pytest.mark.parametrize("columns, experience, indexes, message", [
    (["default"], [[torch.zeros(1)], [torch.zeros(1)]], [0], r"1 columns \['default'\] but 2 lists"),
    (["missing"], [[torch.zeros(1)]], [0], r"unknown columns \['missing'\]"),
    (["default"], [[torch.zeros(1)]], None, "indexes must be provided"),
    (["default"], [[torch.zeros(1)]], [16], r"row 16 is outside the dock's range \[0, 16\)"),
    (["default"], [[torch.zeros(1), torch.zeros(1)]], [3], "has 2 rows but 1 indexes"),
])
def test_a_refused_put_names_the_problem_and_writes_nothing(columns, experience, indexes, message):
    td = _dock()
    with pytest.raises(ValueError, match=message):
        td._put(columns, experience, indexes=indexes)
    assert all(int(s.sum()) == 0 for s in td.experience_data_status.values())


def test_get_refuses_unknown_columns_and_rows_outside_the_dock():
    td = _dock()
    with pytest.raises(ValueError, match=r"unknown columns \['nope'\]"):
        td._get(["nope"], [0])
    with pytest.raises(ValueError, match=r"row 20 is outside"):
        td._get(["default"], [20])
