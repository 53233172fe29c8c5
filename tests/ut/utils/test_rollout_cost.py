"""The rollout step-cost fit and replay (utils/rollout_cost.py), against hand-worked rounds."""
import numpy as np
import pytest

from mindspeed_rl.utils.rollout_cost import StepCost, balance_bound, fit_step_cost, simulate_queue, simulate_static

STEPS = StepCost(1.0, 0.0, 0.0)  # one second a step, whatever runs in it


def test_the_fit_recovers_the_costs_that_made_the_records():
    rng = np.random.default_rng(0)
    live = rng.integers(1, 33, 200)
    prefill = rng.integers(0, 3, 200) * rng.integers(16, 64, 200)
    steps = np.ones(200)
    steps[:20] = rng.integers(8, 64, 20)  # some generate calls of many steps
    seconds = steps * (0.02 + 0.001 * live) + 0.0005 * prefill
    cost = fit_step_cost(np.stack([steps, live, prefill, seconds], axis=1))
    assert cost.per_step == pytest.approx(0.02) and cost.per_seq == pytest.approx(0.001)
    assert cost.per_prefill_token == pytest.approx(0.0005)
    assert cost.of(3, 10, 100) == pytest.approx(3 * (0.02 + 0.01) + 0.05)


def test_the_fit_keeps_every_cost_non_negative():
    # seconds fall as more sequences run: the unconstrained per-sequence cost would be negative
    records = [(1, live, 0, 0.05 - 0.001 * live) for live in range(1, 20)]
    cost = fit_step_cost(records)
    assert cost.per_seq == 0.0 and cost.per_prefill_token == 0.0 and cost.per_step > 0


@pytest.mark.parametrize("records, message", [
    ([], "no trace records"),
    ([(1, 2, 0, -0.1)], "finite and non-negative"),
    ([(1, float("nan"), 0, 0.1)], "finite and non-negative"),
])
def test_bad_records_are_refused(records, message):
    with pytest.raises(ValueError, match=message):
        fit_step_cost(records)


def test_continuous_batching_admits_rows_as_others_finish():
    # cap 2: rows 0 (3 tokens) and 1 (1 token) start; row 2 (2 tokens) joins when row 1 ends after step 1
    replay = simulate_static([5, 5, 5], [3, 1, 2], [[[0, 1, 2]]], STEPS, cap=2)
    assert list(replay.start) == [0, 0, 1] and list(replay.finish) == [3, 1, 3]
    assert replay.busy.tolist() == [3.0] and replay.stage == 3.0
    # each step costs 1 + the rows in it, and a row's prompt tokens enter in its first step
    cost = StepCost(1.0, 1.0, 0.5)
    replay = simulate_static([2, 4, 6], [3, 1, 2], [[[0, 1, 2]]], cost, cap=2)
    # step 1: 2 live + rows 0-1's 6 prompt tokens; steps 2-3: 2 live, and row 2's 6 prompt tokens once
    assert replay.finish.tolist() == [1 * (1 + 2) + 3 + 2 * (1 + 2) + 3, 1 + 2 + 3, 1 + 2 + 3 + 2 * 3 + 3]


def test_a_static_engines_calls_run_one_after_the_other():
    replay = simulate_static([1] * 4, [4, 1, 1, 1], [[[0, 1], [2, 3]]], STEPS, cap=8)
    # the second call starts only when the first call's longest row is done
    assert replay.start.tolist() == [0, 0, 4, 4] and replay.busy.tolist() == [5.0]


def test_a_generate_call_keeps_every_row_until_the_longest_ends():
    cost = StepCost(1.0, 0.5, 0.1)
    replay = simulate_static([3, 5], [2, 6], [[[0, 1]]], cost, mode="chunks")
    seconds = 6 * (1.0 + 0.5 * 2) + 0.1 * 5 * 2
    assert replay.finish.tolist() == [seconds, seconds] and replay.latency.tolist() == [seconds, seconds]


def test_engines_pulling_from_one_queue_share_the_rows():
    lengths = [8, 1, 1, 1, 1, 1, 1, 1, 1]
    static = simulate_static([1] * 9, lengths, [[[0, 1, 2, 3]], [[4, 5, 6, 7, 8]]], STEPS, cap=1)
    queued = simulate_queue([1] * 9, lengths, range(9), 2, STEPS, cap=1)
    assert static.busy.tolist() == [11.0, 5.0]
    # the engine with the long row takes nothing else while the other runs the eight short ones
    assert queued.busy.tolist() == [8.0, 8.0] and queued.rows == [[0], [1, 2, 3, 4, 5, 6, 7, 8]]
    assert queued.bound == 8.0 and static.stage / queued.stage == pytest.approx(11 / 8)
    assert sorted(r for rows in queued.rows for r in rows) == list(range(9))


def test_one_engine_on_the_queue_replays_like_the_same_rows_in_one_call():
    rng = np.random.default_rng(1)
    prompt, resp = rng.integers(4, 40, 30), rng.integers(1, 60, 30)
    cost = StepCost(0.01, 0.002, 0.0003)
    one = simulate_queue(prompt, resp, range(30), 1, cost, cap=6)
    static = simulate_static(prompt, resp, [[list(range(30))]], cost, cap=6)
    np.testing.assert_allclose(one.finish, static.finish)


def test_chunked_engines_take_the_next_chunk_when_their_generate_ends():
    queued = simulate_queue([1] * 6, [5, 1, 1, 1, 1, 1], range(6), 2, STEPS, mode="chunks", chunk=2)
    # engine 0 runs chunk 0 (5 steps); engine 1 runs chunks 1 and 2 (1 step each) meanwhile
    assert queued.rows == [[0, 1], [2, 3, 4, 5]] and queued.busy.tolist() == [5.0, 2.0]


def test_a_prior_sends_the_long_rows_out_first():
    lengths = [1, 1, 1, 1, 1, 1, 6]
    blind = simulate_queue([1] * 7, lengths, range(7), 2, STEPS, cap=1)
    told = simulate_queue([1] * 7, lengths, range(7), 2, STEPS, cap=1, prior=lengths)
    assert blind.stage == 9.0  # the long row starts last
    assert told.stage == 6.0 == told.bound


def test_the_bound_is_the_mean_busy_time_or_the_longest_row():
    assert balance_bound([4.0, 2.0], [1.0, 2.5, float("nan")]) == 3.0
    assert balance_bound([4.0, 2.0], [5.0]) == 5.0
    assert balance_bound([], []) == 0.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="bad"), "mode must be one of"),
    (dict(mode="continuous", cap=0), "needs cap >= 1"),
    (dict(mode="chunks", chunk=None), "chunks need chunk >= 1"),
])
def test_bad_replays_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate_queue([1, 1], [1, 1], [0, 1], 1, STEPS, **kwargs)


def test_lengths_must_pair_up_and_consumers_be_positive():
    with pytest.raises(ValueError, match="2 prompt lengths, 3 response lengths"):
        simulate_static([1, 1], [1, 1, 1], [[[0]]], STEPS, cap=1)
    with pytest.raises(ValueError, match="consumers must be a positive int, got 0"):
        simulate_queue([1], [1], [0], 0, STEPS, cap=1)
