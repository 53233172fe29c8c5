"""The rollout step-cost fit and replay (balance/rollout_cost.py), against hand-worked rounds."""
import numpy as np
import pytest

from mindspeed_rl.balance.rollout_cost import StepCost, balance_bound, fit_step_cost, simulate_queue, simulate_static

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


def test_the_fit_picks_the_best_subset_of_terms_that_stays_non_negative():
    # the three-term fit wants a negative per-sequence cost; of the two-term fits, per step + prefill fits
    # exactly and per step + per sequence does not
    live = np.array([1, 2, 3, 4, 5, 6, 7, 8])
    prefill = np.array([0, 40, 0, 80, 0, 10, 0, 30])
    seconds = 0.01 + 0.001 * prefill
    records = np.stack([np.ones(8), live, prefill, seconds], axis=1)
    cost = fit_step_cost(records)
    assert cost.per_seq == 0.0
    assert cost.per_step == pytest.approx(0.01) and cost.per_prefill_token == pytest.approx(0.001)


def test_of_same_size_fits_the_better_one_is_kept():
    # noisy data: per step + per sequence fits best; per step + prefill fits worse (within 2x) and comes later;
    # all three terms would need a negative prefill cost
    live = [2, 7, 6, 3, 1, 6, 3, 7]
    prefill = [16, 32, 9, 27, 3, 38, 4, 35]
    seconds = [0.01507, 0.01435, 0.02396, 0.01037, 0.01212, 0.02422, 0.01266, 0.01734]
    cost = fit_step_cost(np.stack([np.ones(8), live, prefill, seconds], axis=1))
    x = np.stack([np.ones(8), live], axis=1)
    per_step, per_seq = np.linalg.lstsq(x, seconds)[0]
    assert cost == StepCost(pytest.approx(per_step), pytest.approx(per_seq), 0.0)


def test_a_single_term_is_the_fit_when_every_pair_needs_a_negative_cost():
    live, prefill = [8, 6, 6, 8, 5, 7], [41, 11, 2, 15, 14, 43]
    seconds = [0.00796, 0.01424, 0.01331, 0.00988, 0.01409, 0.00906]
    cost = fit_step_cost(np.stack([np.ones(6), live, prefill, seconds], axis=1))
    assert cost == StepCost(pytest.approx(np.mean(seconds)), 0.0, 0.0)


def test_a_round_that_took_no_time_costs_nothing():
    assert fit_step_cost([(1, 3, 10, 0.0), (1, 2, 0, 0.0)]) == StepCost(0.0, 0.0, 0.0)


@pytest.mark.parametrize("records, message", [
    ([], "no trace records"),
    ([(1, 2, 0, -0.1)], "trace records must be finite and non-negative"),
    ([(1, float("nan"), 0, 0.1)], "trace records must be finite and non-negative"),
])
def test_bad_records_are_refused(records, message):
    with pytest.raises(ValueError, match=f"^fit_step_cost: {message}$"):
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
    replay = simulate_static([1] * 5, [4, 1, 1, 1, 9], [[[0, 1], [], [2, 3]]], STEPS, cap=8)
    # the second call starts only when the first call's longest row is done; an empty call is no call
    assert replay.start.tolist()[:4] == [0, 0, 4, 4] and replay.busy.tolist() == [5.0]
    assert replay.rows == [[0, 1, 2, 3]] and np.isnan(replay.start[4]) and np.isnan(replay.finish[4])
    chunks = simulate_static([1] * 4, [4, 1, 2, 1], [[[0, 1], [2, 3]]], STEPS, mode="chunks")
    assert chunks.finish.tolist() == [4, 4, 6, 6] and chunks.rows == [[0, 1, 2, 3]]


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


def test_a_groups_probe_is_its_evidence_in_the_replay():
    # groups A (rows 0-2, 1 token each) and B (rows 3-4, 6 tokens each), one engine of 2 slots: the probes of
    # A and B go first; when A's second row ends, B's probe has run 2 steps, longer than A's rows: B's second
    # row goes before A's last
    lengths, groups = [1, 1, 1, 6, 6], [0, 0, 0, 1, 1]
    grouped = simulate_queue([1] * 5, lengths, range(5), 1, STEPS, cap=2, groups=groups)
    alone = simulate_queue([1] * 5, lengths, range(5), 1, STEPS, cap=2)
    assert grouped.finish.tolist() == [1, 2, 7, 6, 8] and grouped.rows == [[0, 3, 1, 4, 2]]
    assert alone.finish.tolist() == [1, 1, 2, 7, 8]


def test_the_replay_reports_each_running_rows_tokens_so_far(monkeypatch):
    from mindspeed_rl.balance import rollout_queue
    reports, real = [], rollout_queue.RolloutQueue.take

    def take(self, key, consumer, seq, want, progress=None):
        reports.append(list(progress or []))
        return real(self, key, consumer, seq, want, progress)
    monkeypatch.setattr(rollout_queue.RolloutQueue, "take", take)
    lengths = [3, 5, 2, 7, 1, 4, 6, 2]
    replay = simulate_queue([1] * 8, lengths, range(8), 1, STEPS, cap=3)
    checked = 0
    for report in reports:
        done = [p for p, tokens in report if tokens == lengths[p] and replay.finish[p] == max(
            replay.finish[q] for q, t in report if t == lengths[q])]
        if not done:
            continue
        now = replay.finish[done[0]]  # one second a step: the clock is the step count
        for p, tokens in report:
            if replay.finish[p] > now:  # still running when the engine asked
                assert tokens == now - replay.start[p]
                checked += 1
    assert checked >= 3


def test_chunks_of_one_row_replay():
    one = simulate_queue([1] * 3, [2, 1, 3], range(3), 2, STEPS, mode="chunks", chunk=1)
    assert one.rows == [[0], [1, 2]] and one.finish.tolist() == [2, 1, 4]


def test_take_cap_limits_a_take_and_a_chunk_is_read_in_chunk_mode_only():
    capped = simulate_queue([1] * 4, [1, 1, 1, 1], range(4), 1, STEPS, cap=4, take_cap=1)
    assert capped.start.tolist() == [0, 1, 2, 3]
    free = simulate_queue([1] * 4, [1, 1, 1, 1], range(4), 1, STEPS, cap=4, chunk=1)  # continuous: no chunks
    assert free.start.tolist() == [0, 0, 0, 0]


def test_rows_outside_the_order_are_not_run():
    replay = simulate_queue([1] * 3, [1, 1, 1], [2, 0], 1, STEPS, cap=2)
    assert replay.rows == [[2, 0]] and np.isnan(replay.start[1]) and np.isnan(replay.finish[1])


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
    with pytest.raises(ValueError, match="^simulate: consumers must be a positive int, got 0$"):
        simulate_queue([1], [1], [0], 0, STEPS, cap=1)
    with pytest.raises(ValueError, match="^simulate: consumers must be a positive int, got 1.0$"):
        simulate_queue([1], [1], [0], 1.0, STEPS, cap=1)
