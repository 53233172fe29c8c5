"""A rollout round that stops early (partial rollout's async_engine): once enough groups have every row
complete, the queue hands out only the rows that must still run."""
import pytest

from mindspeed_rl.balance.rollout_queue import COMPLETE, CUT, RUNNING, RolloutQueue, StopRule


def _queue(need, rows=8, groups=(0, 0, 1, 1, 2, 2, 3, 3), sure=None, must=None, chunk=None):
    q = RolloutQueue()
    q.load(1, rows, 1, chunk=chunk, cap=2 if chunk is None else None, groups=list(groups),
           stop=StopRule(need, sure or [False] * rows, must or [False] * rows))
    return q


def test_the_queue_stops_once_enough_groups_are_complete():
    q = _queue(need=1, chunk=2)
    first = q.take(1, 0, 0, 2)
    assert not q.stopped and list(first) == [0, 1]  # group 0
    # one row of group 0 complete, its other row still running: no group complete yet
    q.take(1, 0, 1, 1, progress=[(first[0], 4, COMPLETE), (first[1], 2, RUNNING)])
    assert not q.stopped
    # a cut row does not complete its group (its budget was not its end)
    q.report([(first[1], 5, CUT)])
    assert not q.stopped
    q.report([(first[1], 5, COMPLETE)])
    assert q.stopped
    rest = q.take(1, 0, 2, 2)
    assert list(rest) == [] and rest.left == 0  # nothing more is handed out
    assert q.taken() == {0: [0, 1, 2, 3]}


def test_reports_count_each_row_once_and_sure_rows_complete_when_cut():
    q = _queue(need=2, sure=[True] * 8, chunk=2)
    rows = q.take(1, 0, 0, 2) + q.take(1, 0, 1, 2)
    assert rows == [0, 1, 2, 3]
    q.report([(rows[0], 3, COMPLETE), (rows[0], 3, COMPLETE)])  # the same row twice: once
    assert not q.stopped
    q.report([(r, 5, CUT) for r in rows[1:]])  # last-pass rows: finishing is completing
    assert q.stopped


def test_rows_that_must_run_are_still_handed_out_after_the_stop():
    must = [False] * 6 + [True, True]
    q = _queue(need=0, must=must)  # nothing needed: stopped from the start
    assert q.stopped
    got = q.take(1, 0, 0, 2) + q.take(1, 0, 1, 2)
    assert sorted(got) == [6, 7]
    end = q.take(1, 0, 2, 2)
    assert list(end) == [] and end.left == 0


def test_chunks_skip_the_rows_a_stop_dropped():
    must = [False, False, False, True, False, True, False, False]
    q = _queue(need=1, must=must, chunk=2)
    assert list(q.take(1, 0, 0, 1)) == [0, 1]
    q.report([(0, 1, COMPLETE), (1, 1, COMPLETE)])
    assert list(q.take(1, 0, 1, 1)) == [3, 5]  # after the stop: the rows that must run, in order
    assert list(q.take(1, 0, 2, 1)) == []


def test_plain_rounds_and_two_field_reports_are_unchanged():
    q = RolloutQueue()
    q.load(1, 4, 1, chunk=2)
    assert list(q.take(1, 0, 0, 1, progress=[(0, 3)])) == [0, 1]
    assert list(q.take(1, 0, 1, 1)) == [2, 3]


def test_a_stop_rule_of_another_size_is_refused():
    with pytest.raises(ValueError, match="3 / 8 entries for 8 rows"):
        RolloutQueue().load(1, 8, 1, stop=StopRule(1, [False] * 3, [False] * 8))
