"""Free routing of multi-turn rows on the rollout queue (``handoff``): turns handed back go to the consumer that
runs fewest rows, before fresh rows; the round ends when every row is complete, not when the fresh rows are out."""
import pytest

from mindspeed_rl.utils.rollout_queue import COMPLETE, CUT, RUNNING, WAITING, LocalSource, RolloutQueue, StopRule


def _queue(rows=6, consumers=2, cap=8):
    queue = RolloutQueue()
    queue.load("r", rows, consumers, cap=cap, handoff=True)
    return queue


def test_a_handed_back_turn_goes_to_the_consumer_running_fewest_rows():
    queue = _queue(rows=4)
    first = queue.take("r", 0, 0, 4)
    assert first == [0, 2] and first.handoff  # a first take: every second of the best four
    assert queue.take("r", 1, 0, 4) == [1, 3]
    theirs = queue.take("r", 1, 1, 4, progress=[(1, 3, COMPLETE), (3, 3, COMPLETE)])
    assert theirs == [] and theirs.turns == [] and theirs.left == 2  # rows 0 and 2 still run on consumer 0
    # consumer 0 runs row 2 and hands back row 0's next turn; consumer 1 runs nothing: the turn is 1's
    mine = queue.take("r", 0, 1, 4, progress=[(2, 5, RUNNING)], turns=[(0, "conv0")])
    assert mine == [] and mine.turns == [] and mine.left == 2
    theirs = queue.take("r", 1, 2, 4, progress=[])
    assert theirs.turns == [(0, "conv0")] and theirs == [] and theirs.left == 2


def test_turns_come_before_fresh_rows_up_to_the_free_slots_and_the_share():
    queue = _queue(rows=8, consumers=2, cap=2)
    assert queue.take("r", 0, 0, 2) == [0, 2]
    assert queue.take("r", 1, 0, 2) == [1, 3]
    # consumer 0 hands back two turns and reports nothing running; consumer 1 runs two: 0's share is
    # ceil((2 + 2) / 2) - 0 = 2 turns; its third slot gets a fresh row
    got = queue.take("r", 0, 1, 3, progress=[], turns=[(0, "a"), (2, "b")])
    assert got.turns == [(0, "a"), (2, "b")] and got == [4]
    # with one free slot a consumer gets one turn and no fresh row
    queue.take("r", 1, 1, 0, progress=[(1, 4, RUNNING)], turns=[(3, "c")])
    one = queue.take("r", 1, 2, 1, progress=[(1, 4, RUNNING)])
    assert one.turns == [(3, "c")] and one == []


def test_a_consumer_over_its_share_gets_no_turn_and_the_turn_waits_for_another():
    queue = _queue(rows=8, consumers=2)
    assert queue.take("r", 0, 0, 8) == [0, 2, 4, 6]
    assert queue.take("r", 1, 0, 8) == [1, 3, 5, 7]
    # while both run as many rows, a turn handed back returns to its engine (a tie goes to the one asking)
    back = queue.take("r", 0, 1, 8, progress=[(p, 1, RUNNING) for p in (2, 4, 6)], turns=[(0, "t")])
    assert back.turns == [(0, "t")]
    queue.take("r", 1, 1, 8, progress=[(1, 2, RUNNING), (3, 2, COMPLETE), (5, 2, COMPLETE), (7, 2, COMPLETE)])
    # now consumer 0 runs 3 rows, consumer 1 one: share ceil((3 + 1 + 1) / 2) = 3, so 0 keeps none
    kept = queue.take("r", 0, 2, 8, progress=[(p, 1, RUNNING) for p in (2, 4, 6)], turns=[(0, "t2")])
    assert kept.turns == [] and queue._ready == [(0, "t2")]
    assert queue.take("r", 1, 2, 8, progress=[(1, 3, RUNNING)]).turns == [(0, "t2")]


def test_waiting_rows_are_evidence_not_load():
    queue = _queue(rows=4, consumers=2)
    queue.take("r", 0, 0, 8)
    queue.take("r", 1, 0, 8)
    queue.take("r", 1, 1, 8, progress=[(1, 2, WAITING), (3, 2, WAITING)])
    queue.take("r", 0, 1, 8, progress=[(0, 9, RUNNING)], turns=[(2, "t")])
    # consumer 1 runs nothing (its rows wait on tools): the turn is kept for it, not handed back to 0
    assert queue.take("r", 1, 2, 8, progress=[(1, 2, WAITING), (3, 2, WAITING)]).turns == [(2, "t")]


def test_the_round_ends_only_when_every_row_is_complete():
    queue = _queue(rows=2, consumers=2)
    order, inputs = [10, 11], {"prompts": ["a", "b"]}
    s0, s1 = LocalSource(queue, 0, order, inputs), LocalSource(queue, 1, order, inputs)
    assert s0.request(4)
    got = s0.poll()
    assert got.ids == [10] and not s0.drained and s0.handoff
    s1.request(4)
    assert s1.poll().ids == [11]
    s1.request(4, lambda: [(1, 3, COMPLETE)])
    nothing = s1.poll()
    assert len(nothing) == 0 and not s1.drained  # row 0 still runs on consumer 0: it may hand a turn back
    assert s0.request(0, lambda: [], turns=[(0, "next")])  # a request with only a turn goes out
    assert len(s0.poll()) == 0
    s1.request(4, lambda: [])
    took = s1.poll()
    assert took.turns == [(0, "next")] and len(took) == 1 and not s1.drained
    s1.request(4, lambda: [(0, 7, COMPLETE)])
    assert len(s1.poll()) == 0 and s1.drained
    s0.request(4, lambda: [])
    assert len(s0.poll()) == 0 and s0.drained


def test_a_repeated_take_does_not_hand_its_turns_back_twice():
    queue = _queue(rows=2, consumers=1)
    queue.take("r", 0, 0, 2)
    first = queue.take("r", 0, 1, 0, progress=[(1, 1, RUNNING)], turns=[(0, "t")])
    again = queue.take("r", 0, 1, 0, progress=[(1, 1, RUNNING)], turns=[(0, "t")])
    assert again is first and queue._ready == [(0, "t")]


def test_bad_handoffs_are_refused_before_any_change():
    plain = RolloutQueue()
    plain.load("r", 2, 1, cap=2)
    with pytest.raises(ValueError, match=r"consumer 0 handed back 1 turn\(s\), but round 'r' routes turns to the "
                                         r"engine that holds them \(no handoff\)"):
        plain.take("r", 0, 0, 2, turns=[(0, "t")])
    assert plain.left == 2 and plain.taken() == {}
    queue = _queue(rows=2, consumers=1)
    with pytest.raises(ValueError, match=r"a handed-back turn names position 5, outside \[0, 2\)"):
        queue.take("r", 0, 0, 2, progress=[(0, 3, COMPLETE)], turns=[(5, "t")])
    assert queue.open == 2 and queue._ready == [] and queue.left == 2
    with pytest.raises(ValueError, match="handoff .* needs continuous takes, not chunks"):
        RolloutQueue().load("r", 4, 2, chunk=2, handoff=True)


def test_rows_the_stop_rule_drops_do_not_keep_the_round_open():
    queue = RolloutQueue()
    queue.load("r", 4, 1, cap=1, handoff=True, stop=StopRule(1, [True] * 4, [False] * 4))
    assert queue.take("r", 0, 0, 1) == [0]  # the probe of group 0
    done = queue.take("r", 0, 1, 1, progress=[(0, 4, COMPLETE)])  # one group complete: the rest are dropped
    assert done == [] and done.left == 0 and queue.open == 0


def test_a_round_of_cut_rows_ends_when_each_is_reported_cut_or_complete():

    queue = _queue(rows=3, consumers=1)
    assert queue.take("r", 0, 0, 4) == [0, 1, 2]
    # partial rollout: two rows cut by the pass budget (carried to the next pass), one complete
    still = queue.take("r", 0, 1, 4, progress=[(0, 4, CUT), (1, 4, RUNNING)])
    assert still.left == 2 and queue.open == 2
    done = queue.take("r", 0, 2, 4, progress=[(1, 5, COMPLETE), (2, 4, CUT)])
    assert done.left == 0 and queue.open == 0
