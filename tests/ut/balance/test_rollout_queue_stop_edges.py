"""The stoppable round's edges: a row reported complete twice in separate reports counts once, two-field
reports (no state) never complete a row, and a consumer may ask without a progress callback."""
from mindspeed_rl.balance.rollout_queue import COMPLETE, LocalSource, RolloutQueue, StopRule


def _queue():
    q = RolloutQueue()
    q.load(1, 4, 1, chunk=2, groups=[0, 0, 1, 1], stop=StopRule(1, [False] * 4, [False] * 4))
    return q


def test_a_row_reported_twice_completes_once():
    q = _queue()
    q.take(1, 0, 0, 2)
    q.report([(0, 3, COMPLETE)])
    q.report([(0, 3, COMPLETE)])  # again, in a later report: group 0 still waits for row 1
    assert not q.stopped
    q.report([(1, 2, COMPLETE)])
    assert q.stopped


def test_reports_without_a_state_do_not_complete_rows():
    q = _queue()
    q.take(1, 0, 0, 2, progress=[(0, 3), (1, 3)])
    assert not q.stopped and list(q.take(1, 0, 1, 2, progress=[(0, 4), (1, 4)])) == [2, 3]


def test_a_local_consumer_may_ask_without_progress():
    q = RolloutQueue()
    q.load(1, 4, 1, chunk=2)
    source = LocalSource(q, 0, [10, 11, 12, 13], {"prompts": [0, 1, 2, 3]})
    source.request(2)
    assert source.poll().ids == [10, 11]
