"""Free routing of multi-turn rows on the rollout queue (``handoff``): turns handed back go to the consumer that
runs fewest rows, before fresh rows; the round ends when every row is complete, not when the fresh rows are out."""
import pytest

from mindspeed_rl.balance.rollout_queue import COMPLETE, CUT, RUNNING, WAITING, LocalSource, RolloutQueue, StopRule


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


def test_a_takes_load_counts_the_turns_and_the_fresh_rows_it_hands_out():
    queue = _queue(rows=8, consumers=2, cap=2)
    queue.take("r", 0, 0, 2)
    queue.take("r", 1, 0, 2)
    got = queue.take("r", 0, 1, 3, progress=[], turns=[(0, "a"), (2, "b")])
    assert got.turns == [(0, "a"), (2, "b")] and got == [4] and got.left == 8  # no row complete yet
    # consumer 1 runs one row and hands back a turn with no free slot: the turn waits in the queue
    assert queue.take("r", 1, 1, 0, progress=[(1, 4, RUNNING)], turns=[(3, "c")]).turns == []
    # consumer 0 runs three (two turns, one fresh row) and says nothing new: over its share of the turn
    mine = queue.take("r", 0, 2, 1)
    assert mine.turns == [] and len(mine) == 1
    assert queue.take("r", 1, 2, 1, progress=[(1, 4, RUNNING)]).turns == [(3, "c")]


def test_a_turn_handed_to_a_consumer_counts_once_for_it():
    queue = _queue(rows=8, consumers=2)
    assert queue.take("r", 0, 0, 8) == [0, 2, 4, 6]
    assert queue.take("r", 1, 0, 8) == [1, 3, 5, 7]
    # consumer 0's rows wait on tools; it hands one back and gets it (one ready turn: one row more, not its share)
    back = queue.take("r", 0, 1, 8, progress=[(p, 1, WAITING) for p in (2, 4, 6)], turns=[(0, "t")])
    assert back.turns == [(0, "t")]
    # consumer 1 runs two rows: share ceil((1 + 2 + 1) / 2) = 2, so its turn goes to consumer 0, which runs one
    theirs = queue.take("r", 1, 1, 8, progress=[(1, 1, RUNNING), (3, 1, RUNNING), (5, 1, WAITING), (7, 1, COMPLETE)],
                        turns=[(5, "u")])
    assert theirs.turns == []
    assert queue.take("r", 0, 2, 8).turns == [(5, "u")]


def test_a_take_without_a_report_keeps_the_consumers_load():
    queue = _queue(rows=12, consumers=2)
    assert len(queue.take("r", 0, 0, 8)) == 6
    queue.take("r", 1, 0, 8)
    queue.take("r", 0, 1, 8, progress=[(p, 1, RUNNING) for p in (2, 4, 6, 8, 10)] + [(0, 1, WAITING)])
    # consumer 1 runs one row and hands a turn back with no free slot
    queue.take("r", 1, 1, 0, progress=[(1, 1, RUNNING)] + [(p, 1, COMPLETE) for p in (3, 5, 7, 9, 11)],
               turns=[(1, "t")])
    # consumer 0 still runs five (it sent no report): share ceil((5 + 1 + 1) / 2) = 4, none for it
    assert queue.take("r", 0, 2, 8).turns == []
    assert queue.take("r", 1, 2, 8, progress=[]).turns == [(1, "t")]


def test_a_consumer_that_reports_nothing_running_gets_its_share():
    queue = _queue(rows=4, consumers=2)
    queue.take("r", 0, 0, 8)
    queue.take("r", 1, 0, 8)
    queue.take("r", 1, 1, 8, progress=[(1, 2, COMPLETE), (3, 2, COMPLETE)])
    # consumer 0 hands its turn back with no free slot; consumer 1, running nothing, gets it
    assert queue.take("r", 0, 1, 0, progress=[(2, 1, WAITING)], turns=[(0, "t")]).turns == []
    assert queue.take("r", 1, 2, 8, progress=[]).turns == [(0, "t")]


def test_turns_are_handed_at_most_as_many_as_free_slots():
    queue = _queue(rows=4, consumers=2)
    queue.take("r", 0, 0, 8)
    queue.take("r", 1, 0, 8)
    queue.take("r", 1, 1, 8, progress=[(1, 2, WAITING), (3, 2, WAITING)], turns=[])
    queue.take("r", 0, 1, 0, progress=[(0, 1, WAITING), (2, 1, WAITING)], turns=[(0, "a"), (2, "b")])
    queue.take("r", 1, 2, 0, progress=[(1, 2, WAITING), (3, 2, WAITING)], turns=[(1, "c"), (3, "d")])
    # four ready, nothing running: share 2, but one free slot gets one turn, the oldest
    one = queue.take("r", 1, 3, 1, progress=[])
    assert one.turns == [(0, "a")] and one == []
    assert queue._ready == [(2, "b"), (1, "c"), (3, "d")]


def test_a_row_reported_complete_twice_counts_once():
    queue = _queue(rows=2, consumers=1)
    queue.take("r", 0, 0, 2)
    assert queue.take("r", 0, 1, 2, progress=[(0, 3, COMPLETE), (1, 2, RUNNING)]).left == 1
    again = queue.take("r", 0, 2, 2, progress=[(0, 3, COMPLETE), (1, 3, RUNNING)])
    assert again.left == 1 and queue.open == 1  # row 1 still runs: the round is not over


def test_a_handoff_round_takes_evidence_without_states():
    queue = _queue(rows=4, consumers=1, cap=1)
    assert queue.take("r", 0, 0, 1) == [0]
    got = queue.take("r", 0, 1, 1, progress=[(0, 7)])  # (position, tokens): evidence only, no state
    assert got == [1] and got.left == 4 and queue.open == 4 and queue.expected()[0] == 7


def test_a_handoff_round_with_a_stop_keeps_the_rows_that_must_run_open():
    queue = RolloutQueue()
    queue.load("r", 4, 1, cap=1, handoff=True, stop=StopRule(1, [True] * 4, [False, False, True, False]))
    assert queue.take("r", 0, 0, 1) == [0]
    done = queue.take("r", 0, 1, 1, progress=[(0, 4, COMPLETE)])  # stopped: rows 1 and 3 dropped, row 2 must run
    assert done == [2] and done.left == 1 and queue.open == 1
    assert queue.take("r", 0, 2, 1, progress=[(2, 4, COMPLETE)]).left == 0


def test_a_turn_at_the_row_count_is_outside_the_round():
    queue = _queue(rows=2, consumers=1)
    with pytest.raises(ValueError, match=r"a handed-back turn names position 2, outside \[0, 2\)"):
        queue.take("r", 0, 0, 2, turns=[(2, "t")])
    with pytest.raises(ValueError, match=r"^rollout queue: handoff \(free routing of turns\) needs continuous "
                                         r"takes, not chunks$"):
        RolloutQueue().load("r", 4, 2, chunk=2, handoff=True)


def test_a_plain_round_does_not_route_turns_freely():
    queue = RolloutQueue()
    queue.load("r", 2, 1, cap=1)
    source = LocalSource(queue, 0, [5, 6], {"prompts": ["a", "b"]})
    assert source.request(1)
    assert not source.request(1)  # one request at a time: a second is not sent (its turns stay with the caller)
    got = source.poll()
    assert got.ids == [5] and source.handoff is False and queue.take("r", 0, 0, 1).handoff is False
    source.request(1)
    source.poll()
    assert source.drained and not source.request(1, turns=[(0, "t")])  # drained: nothing goes out


def test_a_bool_is_no_turn_position_and_no_free_slot_takes_no_turn():
    queue = _queue(rows=4, consumers=1)
    with pytest.raises(ValueError, match=r"a handed-back turn names position True, outside \[0, 4\)"):
        queue.take("r", 0, 0, 2, turns=[(True, "t")])
    queue.take("r", 0, 0, 4)
    queue.take("r", 0, 1, 0, progress=[], turns=[(0, "a"), (1, "b")])
    # a want below zero (a caller's slip) is no free slot: the turns stay in the queue
    assert queue.take("r", 0, 2, -1, progress=[]).turns == [] and queue._ready == [(0, "a"), (1, "b")]
