"""The rollout queue's take rule (balance/rollout_queue.py): chunks, fair continuous takes, probes, evidence,
the dealt first wave, memoised takes, and the prompt-length prior."""
import math

import numpy as np
import pytest
import torch

from mindspeed_rl.balance.rollout_queue import LocalSource, PromptLengths, RolloutQueue, Take


def _drain(queue, consumers, want, key=1, progress=None, max_rounds=10_000):
    """Round-robin takes until every consumer gets an empty answer; returns each consumer's takes. A queue that
    answers forever fails after ``max_rounds`` rounds instead of hanging."""
    takes, seq, done = {c: [] for c in range(consumers)}, [0] * consumers, set()
    for _ in range(max_rounds):
        if len(done) == consumers:
            return takes
        for c in range(consumers):
            if c in done:
                continue
            rows = queue.take(key, c, seq[c], want, progress)
            seq[c] += 1
            if rows:
                takes[c].append(rows)
            else:
                done.add(c)
    pytest.fail(f"the queue still hands out rows after {max_rounds} rounds ({len(done)} of {consumers} consumers done)")


def test_chunks_are_fixed_slices_whoever_takes_them():
    queue = RolloutQueue()
    queue.load(1, 10, 2, chunk=4)
    assert queue.take(1, 1, 0, want=99) == [0, 1, 2, 3]  # the want of a chunked take does not matter
    assert queue.take(1, 0, 0, want=1) == [4, 5, 6, 7]
    assert queue.take(1, 0, 1, want=1) == [8, 9]  # the last chunk is short
    assert queue.take(1, 1, 1, want=4) == [] and queue.left == 0


def test_continuous_takes_cover_every_row_once_within_want_fair_share_and_cap():
    queue = RolloutQueue()
    queue.load(1, 50, 3, cap=7)
    left, seen = 50, []
    for step in range(60):
        consumer = step % 3
        rows = queue.take(1, consumer, step // 3, want=5 if consumer else 9)
        assert len(rows) <= min(5 if consumer else 9, math.ceil(left / 3) if left else 0, 7)
        assert len(rows) >= 1 or left == 0  # nothing is held back while rows are left
        left -= len(rows)
        seen += rows
    assert sorted(seen) == list(range(50)) and queue.left == 0


def test_the_fair_share_stops_the_first_engine_from_emptying_the_queue():
    queue = RolloutQueue()
    queue.load(1, 64, 2)  # no cap: an engine with 256 free slots asks for all of them
    first = queue.take(1, 0, 0, want=256)
    second = queue.take(1, 1, 0, want=256)
    assert len(first) == 32 and len(second) == 32
    assert sorted(first + second) == list(range(64))


def test_a_probe_of_every_group_goes_out_before_a_second_row_of_any():
    queue = RolloutQueue()
    queue.load(1, 12, 1, groups=np.arange(12) // 4)  # 3 groups of 4 rows
    assert queue.take(1, 0, 0, want=5) == [0, 4, 8, 1, 2]


def test_the_groups_that_run_long_go_first():
    queue = RolloutQueue()
    queue.load(1, 12, 1, groups=np.arange(12) // 4)
    assert queue.take(1, 0, 0, want=3) == [0, 4, 8]
    # group 2's probe has made 40 tokens, group 0's finished at 5, group 1's at 12
    assert queue.take(1, 0, 1, want=4, progress=[(8, 40), (0, 5), (4, 12)]) == [9, 10, 11, 5]
    assert list(queue.expected()) == [5, 12, 40]


def test_a_prior_orders_the_probes_and_evidence_above_it_wins():
    queue = RolloutQueue()
    prior = np.repeat([10.0, 30.0, np.nan], 2)
    queue.load(1, 6, 1, groups=np.arange(6) // 2, prior=prior)
    # the unknown group ranks at the mean of the known ones (20): between the two
    assert queue.take(1, 0, 0, want=3) == [2, 4, 0]
    queue.report([(0, 50)])
    assert list(queue.expected()) == [50, 30, 40]


def test_the_first_wave_is_dealt_round_robin_not_longest_rows_to_the_first_to_ask():
    queue = RolloutQueue()
    prior = np.arange(8, 0, -1).astype(float)  # position 0 is expected longest
    queue.load(1, 8, 2, prior=prior)
    first = queue.take(1, 0, 0, want=4)
    second = queue.take(1, 1, 0, want=4)
    assert first == [0, 2, 4, 6] and second == [1, 3, 5, 7]
    # once every consumer has started, a take is the best rows in order
    queue.load(2, 8, 2, prior=prior)
    queue.take(2, 0, 0, want=1)
    queue.take(2, 1, 0, want=1)
    assert queue.take(2, 0, 1, want=3) == [2, 3, 4]


def test_a_repeated_take_is_answered_not_served_twice():
    queue = RolloutQueue()
    queue.load(7, 6, 2, chunk=2)
    rows = queue.take(7, 0, 0, want=2)
    # a TP peer (the same consumer, the same take) gets the same rows; the queue did not move
    assert queue.take(7, 0, 0, want=2) == rows and queue.left == 4
    assert queue.taken() == {0: rows}
    with pytest.raises(ValueError, match="consumer 0 asked for take 2, expected take 1"):
        queue.take(7, 0, 2, want=2)


@pytest.mark.parametrize("call, message", [
    (lambda q: q.take(2, 0, 0, 1), "a take for round 2, but the queue holds round 1"),
    (lambda q: q.take(1, 2, 0, 1), r"consumer 2 is outside \[0, 2\)"),
    (lambda q: q.take(1, -1, 0, 1), r"consumer -1 is outside \[0, 2\)"),
    (lambda q: q.take(1, True, 0, 1), r"consumer True is outside \[0, 2\)"),
    (lambda q: q.take(1, 1, 1, 1), "consumer 1 asked for take 1, expected take 0"),
    (lambda q: q.report([(0, 3), (6, 3)]), r"progress names position 6, outside \[0, 6\)"),
    (lambda q: q.report([(0, 3), (-1, 3)]), r"progress names position -1, outside \[0, 6\)"),
    (lambda q: q.load(1, 0, 2), "rows must be a positive int, got 0"),
    (lambda q: q.load(1, 4, True), "consumers must be a positive int, got True"),
    (lambda q: q.load(1, 4, 2, chunk=0), "chunk must be a positive int or None, got 0"),
    (lambda q: q.load(1, 4, 2, cap=2.5), "cap must be a positive int or None, got 2.5"),
    (lambda q: q.load(1, 4, 2, groups=[0, 1]), "groups has 2 entries for 4 rows"),
    (lambda q: q.load(1, 4, 2, prior=[1.0]), "prior has 1 entries for 4 rows"),
    (lambda q: q.load(1, 4, 2, groups=[0, -1, 0, 0]), "group ids must be >= 0"),
])
def test_bad_calls_name_what_is_wrong_and_change_nothing(call, message):
    queue = RolloutQueue()
    queue.load(1, 6, 2, groups=np.arange(6) // 3)
    with pytest.raises(ValueError, match=f"^rollout queue: {message}$"):
        call(queue)
    assert queue.key == 1 and queue.left == 6 and queue.rows == 6 and queue.consumers == 2


def test_a_queue_without_a_round_refuses_takes():
    queue = RolloutQueue()
    assert queue.left == 0 and queue.taken() == {}
    with pytest.raises(ValueError, match="^rollout queue: a take for round None, but the queue holds no round$"):
        queue.take(None, 0, 0, 1)


def test_with_nothing_known_every_group_ranks_alike():
    queue = RolloutQueue()
    queue.load(1, 6, 1, groups=[0, 0, 1, 1, 2, 2])
    assert list(queue.expected()) == [0.0, 0.0, 0.0]


def test_groups_and_prior_as_columns_read_as_rows():
    flat, column = RolloutQueue(), RolloutQueue()
    groups, prior = np.repeat([0, 1, 2], 2), np.repeat([5.0, 50.0, np.nan], 2)
    flat.load(1, 6, 1, groups=groups, prior=prior)
    column.load(1, 6, 1, groups=groups.reshape(-1, 1), prior=prior.reshape(-1, 1))
    assert list(column.expected()) == list(flat.expected()) == [5.0, 50.0, 27.5]
    assert column.take(1, 0, 0, 6) == flat.take(1, 0, 0, 6) == [2, 4, 0, 3, 5, 1]


def test_a_local_source_asks_once_at_a_time_and_marks_the_end():
    queue = RolloutQueue()
    queue.load(3, 5, 1, chunk=2)
    asked = []
    source = LocalSource(queue, 0, order=[40, 41, 42, 43, 44], inputs={"prompts": list("abcde")})
    assert source.poll() is None and not source.waiting  # a plain poll does not ask
    source.request(0, progress=lambda: asked.append("none wanted") or [])
    assert not source.waiting and asked == []
    source.request(2, progress=lambda: asked.append("sent") or [])
    source.request(2, progress=lambda: asked.append("again") or [])  # one request at a time
    assert source.waiting and asked == ["sent"]
    got = source.poll()
    assert got.positions == [0, 1] and got.ids == [40, 41] and got.inputs == {"prompts": ["a", "b"]}
    assert source.poll(block=True).ids == [42, 43] and not source.drained  # a blocking poll asks by itself
    assert source.poll(block=True).ids == [44] and source.drained  # the queue held nothing after it
    source.request(5)
    assert source.poll(block=True) is None and queue.taken() == {0: [0, 1, 2, 3, 4]}  # nothing more is asked


def test_a_local_sources_progress_reaches_the_queue_and_a_bare_blocking_poll_asks_for_one_row():
    queue = RolloutQueue()
    queue.load(1, 6, 1, groups=np.arange(6) // 2)
    source = LocalSource(queue, 0, order=list(range(6)), inputs={"prompts": list(range(6))})
    assert source.poll(block=True).positions == [0]
    source.request(1, progress=lambda: [(0, 9)])
    assert source.poll().positions == [2] and list(queue.expected()) == [9.0, 9.0, 9.0]  # the probe of group 1


def test_prompt_lengths_average_a_group_and_keep_the_newest_round():
    lengths = PromptLengths(limit=2)
    a, b, c = torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6])
    assert np.isnan(lengths.expect([a])).all()
    lengths.update([a, a, b], [10, 20, 7])
    assert list(lengths.expect([a, b])) == [15.0, 7.0]
    lengths.update([a], [3])  # the newest round replaces the last
    assert lengths.expect([torch.tensor([1, 2, 3], dtype=torch.int32)])[0] == 3.0  # the tokens, not the dtype
    lengths.update([c], [9])  # over the limit: b, the oldest, is forgotten
    assert np.isnan(lengths.expect([b])[0]) and list(lengths.expect([a, c])) == [3.0, 9.0]


def test_a_load_can_answer_every_engines_first_take():
    queue, asked = RolloutQueue(), RolloutQueue()
    prior = np.arange(8, 0, -1).astype(float)
    firsts = queue.load(1, 8, 2, prior=prior, first=3)
    asked.load(1, 8, 2, prior=prior)
    # the same takes as the engines asking one after the other, each told what the queue holds after them all
    assert firsts == {0: asked.take(1, 0, 0, 3), 1: asked.take(1, 1, 0, 3)} == {0: [0, 2, 4], 1: [1, 3, 5]}
    assert [t.left for t in firsts.values()] == [2, 2] and queue.left == 2
    assert queue.take(1, 1, 0, 99) == [1, 3, 5]  # the take is the consumer's take 0: asking again answers it
    assert queue.take(1, 1, 1, 99) == [6] and queue.take(1, 1, 1, 99).left == 1
    assert queue.load(2, 4, 2, chunk=2) == {}  # without ``first`` nothing is answered
    with pytest.raises(ValueError, match="^rollout queue: first must be a positive int or None, got 0$"):
        queue.load(3, 4, 2, first=0)


def test_a_take_travels_with_what_was_left():
    import pickle
    take = pickle.loads(pickle.dumps(Take([3, 4], left=5)))
    assert take == [3, 4] and take.left == 5 and isinstance(take, Take)


def test_a_source_reads_its_first_take_without_asking():
    queue = RolloutQueue()
    firsts = queue.load(1, 3, 2, first=1)
    source = LocalSource(queue, 1, order=[7, 8, 9], inputs={"prompts": list("xyz")}, first=firsts[1])
    source.request(5, progress=lambda: pytest.fail("no request goes out while the first take is unread"))
    assert not source.waiting and source.poll().ids == [8] and source.seq == 1 and not source.drained
    assert source.poll(block=True).ids == [9] and source.drained  # take 1, the last row
    both = RolloutQueue()
    done = both.load(1, 2, 2, chunk=1, first=1)  # each engine's first take empties the queue
    source = LocalSource(both, 0, order=[5, 6], inputs={"prompts": ["p", "q"]}, first=done[0])
    assert source.poll().ids == [5] and source.drained
