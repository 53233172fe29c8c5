"""The dock's side of the rollout queue: the round it loads, the one checked write of what the engines made,
the prompts' lengths it keeps for the next rounds, and the round's balance figures."""
import dataclasses

import numpy as np
import pytest
import torch

from mindspeed_rl.plan.rollout_spec import RolloutSpec
from mindspeed_rl.plan.run_plan import Layout, RunPlan, StagePlan
from mindspeed_rl.plan.stages import ROLLOUT
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.balance.rollout_figures import queue_figures, rollout_figures, static_calls
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.balance.rollout_cost import StepCost, fit_step_cost, simulate_queue, simulate_static
from mindspeed_rl.balance.seqlen_balancing import imbalance

N = 2  # samples per prompt


def _plan(backend="vllm", queued=True, rows_per_share=4, tp=1, max_num_seqs=3):
    rollout = StagePlan(ROLLOUT.name, rows_per_share, 1, False, stage=ROLLOUT, inputs=("prompts",), queued=queued)
    plan = RunPlan(Layout(2 * tp, 2, tp), prompts_per_round=4, n_samples=N, mini_batch_rows=8, epochs=1,
                   train_iters=1, stages={ROLLOUT.name: rollout})
    spec = RolloutSpec(backend, "test", max_num_seqs=max_num_seqs)
    return dataclasses.replace(plan, worker=dataclasses.replace(plan.worker, rollout=spec))


def _dock(plan=None, prompt_lengths=(3, 5, 2, 4)):
    dock = DriverDock(4, N, run_plan=plan or _plan())
    dock.start_round({"prompts": [torch.arange(p) + 10 * i for i, p in enumerate(prompt_lengths)]})
    return dock


def _made(rows, lengths):
    """One consumer's output: responses of the given lengths for ``rows``."""
    responses = [torch.ones(n, dtype=torch.int32) for n in lengths]
    return rows, {"responses": responses, "response_length": [torch.tensor([n], dtype=torch.int32) for n in lengths]}


GROUP = StageGroup.of(ROLLOUT)


def test_the_round_goes_into_the_queue_whole_with_its_groups():
    queued = _dock().queue_round(GROUP)
    assert queued.order == list(range(8))
    assert [p.tolist() for p in queued.batch["prompts"]] == [[0, 1, 2]] * 2 + [[10, 11, 12, 13, 14]] * 2 + \
        [[20, 21]] * 2 + [[30, 31, 32, 33]] * 2
    assert queued.groups == [0, 0, 1, 1, 2, 2, 3, 3]
    assert np.isnan(queued.prior).all()  # nothing rolled out yet


def test_what_the_engines_made_lands_in_its_rows_whichever_engine_made_it():
    dock = _dock()
    queued = dock.queue_round(GROUP)
    dock.put_queued(GROUP, queued.order, [_made([5, 0, 7], [1, 2, 3]), _made([1, 2, 3, 4, 6], [4, 5, 6, 7, 8])])
    got = dock.get_rows(["response_length"], list(range(8)))["response_length"]
    assert [int(x) for x in got] == [2, 4, 5, 6, 7, 1, 8, 3]


def test_the_prompts_lengths_order_the_next_round():
    dock = _dock()
    queued = dock.queue_round(GROUP)
    dock.put_queued(GROUP, queued.order, [_made(list(range(8)), [2, 4, 9, 11, 1, 1, 3, 3])])
    # the same prompts, in another order, come back with their groups' mean lengths as the prior
    dock.start_round({"prompts": [torch.arange(4) + 30, torch.arange(3), torch.arange(7) + 50,
                                  torch.arange(5) + 10]})
    assert dock.queue_round(GROUP).prior[::N] == [3.0, 3.0, pytest.approx(float("nan"), nan_ok=True), 10.0]


@pytest.mark.parametrize("made, message", [
    ([_made([0, 1, 2, 3], [1] * 4), _made([3], [1]), _made([4, 5, 6, 7], [1] * 4)],
     "row 3 was made by consumers 0 and 1"),
    ([_made([0, 1, 2, 3], [1] * 4), _made([4, 5, 6], [1] * 3)], r"the consumers' rows do not cover the round: "
     r"missing \[7\], not in the round \[\]"),
    ([_made([0, 1, 2, 3, 4, 5, 6, 7, 9], [1] * 9)], r"the consumers' rows do not cover the round: missing \[\], "
     r"not in the round \[9\]"),
    ([], r"the consumers' rows do not cover the round: missing \[0, 1, 2, 3, 4, 5, 6, 7\], not in the round \[\]"),
    ([_made([0, 1, 2, 3], [1] * 4), ([4, 5, 6, 7], {"responses": [torch.ones(1)] * 4})],
     r"consumer 1: gave columns \['responses'\], the stage writes \['response_length', 'responses'\]"),
    ([_made([0, 1, 2, 3], [1] * 4), ([4, 5, 6, 7], {"responses": [torch.ones(1)] * 3,
                                                    "response_length": [torch.ones(1)] * 4})],
     "consumer 1: column 'response_length' has 4 rows, but 'responses' has 3"),
])
def test_a_bad_put_names_the_consumer_or_row_and_writes_nothing(made, message):
    dock = _dock()
    queued = dock.queue_round(GROUP)
    with pytest.raises(ValueError, match=rf"^put_queued\('actor_rollout'\): {message}$"):
        dock.put_queued(GROUP, queued.order, made)
    assert int(dock.experience_data_status["responses"].sum()) == 0
    assert dock.prompt_lengths.lengths == {}


def test_a_long_list_of_missing_rows_is_cut_at_sixteen():
    dock = DriverDock(12, N, run_plan=_plan())
    dock.start_round({"prompts": [torch.arange(3) + i for i in range(12)]})
    queued = dock.queue_round(GROUP)
    with pytest.raises(ValueError, match=r"missing \[2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17\], "):
        dock.put_queued(GROUP, queued.order, [_made([0, 1], [1, 1])])
    with pytest.raises(ValueError, match=r"not in the round \[24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, "
                                         r"37, 38, 39\]$"):
        dock.put_queued(GROUP, queued.order, [_made(list(range(44)), [1] * 44)])


def test_a_consumer_that_made_nothing_is_passed_over():
    dock = _dock()
    queued = dock.queue_round(GROUP)
    dock.put_queued(GROUP, queued.order, [_made([0, 1, 2], [1, 2, 3]), _made([], []), _made([3, 4, 5, 6, 7], [4] * 5)])
    got = dock.get_rows(["response_length"], list(range(8)))["response_length"]
    assert [int(x) for x in got] == [1, 2, 3, 4, 4, 4, 4, 4]


def test_a_queued_round_needs_its_inputs_and_runs_alone():
    dock = DriverDock(4, N, run_plan=_plan())
    dock.put_experience({"prompts": [torch.arange(3)] * 8}, list(range(8)))  # no prompt_length
    with pytest.raises(RuntimeError, match=r"^transfer dock: stage 'actor_rollout' needs data that was never put: "
                                           r"'prompt_length' rows \[0, 1, 2, 3, 4, 5, 6, 7\]$"):
        dock.queue_round(GROUP)
    pair = StageGroup((ROLLOUT, ROLLOUT))
    with pytest.raises(ValueError, match=r"^queue_round: a queued stage runs alone, got \['actor_rollout', "
                                         r"'actor_rollout'\]$"):
        _dock().queue_round(pair)


def test_a_queued_stage_has_no_plan_and_a_planned_one_no_queue():
    with pytest.raises(ValueError, match="served from a queue"):
        _dock().plan_stage(ROLLOUT.name)
    with pytest.raises(ValueError, match="planned, not queued"):
        _dock(_plan(queued=False)).queue_round(GROUP)


def test_engines_and_takes_follow_the_backend():
    vllm, hf = _plan("vllm", tp=2), _plan("hf", tp=2)
    stage = vllm.stages[ROLLOUT.name]
    # vLLM: every rank's whole-model engine is a consumer, continuous takes of at most the dispatch size
    assert vllm.rollout_consumers == 4 and vllm.rollout_takes(stage) == (None, 4)
    # transformers generate on a TP-sharded model: one consumer per TP group, fixed chunks
    assert hf.rollout_consumers == 2 and hf.rollout_takes(stage) == (4, None)


def _traces(busy, rows, latency, records):
    return [{"consumer": c, "rows": r, "busy": b, "latency": l, "trace": t}
            for c, (b, r, l, t) in enumerate(zip(busy, rows, latency, records))]


def _expected(name, busy, rows, latency, static, replay, cost, takes):
    """Every figure of a round, computed here from its parts (``takes``: each engine's)."""
    key = lambda stat: f"dp_balance/{name}/{stat}"  # noqa: E731
    stage, bound = max(busy), max(np.mean(busy), max(latency))
    out = {key("rank_imbalance"): stage / np.mean(busy) - 1, key("stage_s"): stage, key("bound_s"): bound,
           key("bound_gap"): stage / bound - 1, key("static_s"): static.stage, key("static_gain"): static.stage / stage,
           key("replay_s"): replay.stage, key("replay_error"): replay.stage / stage - 1,
           key("cost_per_step_ms"): cost.per_step * 1e3, key("cost_per_seq_ms"): cost.per_seq * 1e3,
           key("cost_per_prefill_token_ms"): cost.per_prefill_token * 1e3,
           key("balanced_takes"): float(sum(t - 1 for t in takes if t > 1)), key("busy_mean_s"): np.mean(busy),
           key("measured"): 1.0}
    for c, (b, r, t) in enumerate(zip(busy, rows, takes)):
        out[key(f"rank{c}")], out[key(f"rows/rank{c}")], out[key(f"takes/rank{c}")] = b, float(len(r)), float(t)
    return out


COST = StepCost(0.5, 0.25, 0.125)


def _records(cost, steps_live_prefill):
    return [(s, l, p, cost.of(s, l, p)) for s, l, p in steps_live_prefill]


@pytest.mark.parametrize("chunk, take_cap", [(None, 1), (2, None)])
def test_the_figures_measure_the_engines_and_replay_the_static_split(chunk, take_cap):
    prompt, resp = np.array([4, 2, 4, 3, 1, 2]), np.array([6, 1, 1, 5, 2, 1])
    groups, prior = [0, 0, 1, 1, 2, 2], [np.nan, np.nan, 9.0, 9.0, 1.0, 1.0]
    busy, rows, latency = [6.0, 4.0], [[0, 1, 4], [2, 3, 5]], [[3.0, 1.0, 2.0], [1.0, 3.0, 1.0]]
    records = [_records(COST, [(1, 2, 4), (1, 3, 0), (2, 1, 0)]), _records(COST, [(1, 1, 2), (3, 2, 5)])]
    split = [[0, 3], [1, 4], [2, 5]]
    metrics, plan = queue_figures("actor_rollout", list(range(6)), prompt, resp, _traces(busy, rows, latency, records),
                                  2, chunk, take_cap, 2, split, groups, prior)
    mode = "chunks" if chunk else "continuous"
    cost = fit_step_cost(np.concatenate(records))
    static = simulate_static(prompt, resp, [[[0, 3], [2, 5]], [[1, 4]]], cost, mode, cap=2)
    replay = simulate_queue(prompt, resp, range(6), 2, cost, mode, cap=2, chunk=chunk, take_cap=take_cap,
                            groups=groups, prior=prior)
    # no count in the traces: a take per generate (chunks), per step that prefilled new rows (continuous)
    takes = [1, 2] if chunk is None else [3, 2]
    want = _expected("actor_rollout", busy, rows, [x for l in latency for x in l], static, replay, cost, takes)
    assert metrics.keys() == want.keys() and metrics == pytest.approx(want)
    assert plan == {"consumer": "actor_rollout", "objective": "seconds", "balanced": True, "served": "queue",
                    "loads": busy, "random_loads": pytest.approx(static.busy.tolist()), "sizes": [3, 3],
                    "lower_bound": 5.0}
    assert metrics["dp_balance/actor_rollout/bound_gap"] == pytest.approx(0.2)  # 6 s over a bound of 5 (the mean)
    assert all(type(size) is int for size in plan["sizes"])  # counts, as balance.jsonl writes them
    # the replay is the queue's own: without its groups and prior, its cap, or its chunks it comes out otherwise
    if chunk is None:
        others = [dict(take_cap=take_cap), dict(take_cap=None, groups=groups, prior=prior)]
    else:
        others = [dict(mode="continuous", take_cap=None, groups=groups, prior=prior)]
    for other in others:
        other = {"mode": mode, "chunk": chunk, **other}
        again = simulate_queue(prompt, resp, range(6), 2, cost, cap=2, **other)
        assert again.finish.tolist() != replay.finish.tolist(), other


def test_the_static_split_is_replayed_in_the_backends_mode():
    prompt, resp = np.array([1, 1, 1, 1]), np.array([4, 1, 1, 1])
    traces = _traces([4.0, 2.0], [[0], [1, 2, 3]], [[4.0], [1.0, 1.0, 1.0]],
                     [[(1, 1, 0, 1.0)] * 4, [(1, 2, 0, 1.0)] * 2])  # a second a step, however many rows
    continuous, _ = queue_figures("r", [0, 1, 2, 3], prompt, resp, traces, 2, None, None, 1, [[0, 1], [2, 3]])
    chunks, _ = queue_figures("r", [0, 1, 2, 3], prompt, resp, traces, 2, 2, None, 1, [[0, 1], [2, 3]])
    # one slot a step: 4 + 1 steps for rows 0, 1 one after the other; as one generate, 4 steps for both
    assert continuous["dp_balance/r/static_s"] == pytest.approx(5.0) and chunks["dp_balance/r/static_s"] == pytest.approx(4.0)


def test_figures_of_a_round_without_time():
    traces = _traces([0.0], [[0, 1]], [[0.0, 0.0]], [[]])
    metrics, plan = queue_figures("actor_rollout", [0, 1], [1, 1], [1, 1], traces, 1, 2, None, 1, [[0, 1]])
    assert metrics == {"dp_balance/actor_rollout/rank_imbalance": 0.0, "dp_balance/actor_rollout/stage_s": 0.0,
                       "dp_balance/actor_rollout/bound_s": 0.0, "dp_balance/actor_rollout/bound_gap": 0.0,
                       "dp_balance/actor_rollout/rank0": 0.0, "dp_balance/actor_rollout/rows/rank0": 2.0,
                       "dp_balance/actor_rollout/takes/rank0": 0.0, "dp_balance/actor_rollout/balanced_takes": 0.0,
                       "dp_balance/actor_rollout/busy_mean_s": 0.0, "dp_balance/actor_rollout/measured": 0.0}
    assert plan["random_loads"] == [0.0]
    # timed steps but no busy time measured: the replay runs, its ratios fall back to 1 and 0
    traces = _traces([0.0], [[0, 1]], [[0.0, 0.0]], [[(1, 2, 2, 0.5)]])
    metrics, _ = queue_figures("actor_rollout", [0, 1], [1, 1], [1, 1], traces, 1, 2, None, 1, [[0, 1]])
    assert metrics["dp_balance/actor_rollout/static_gain"] == 1.0
    assert metrics["dp_balance/actor_rollout/replay_error"] == 0.0 and metrics["dp_balance/actor_rollout/static_s"] > 0
    # steps recorded but none took time: nothing to fit, no replay
    traces = _traces([0.0], [[0, 1]], [[0.0, 0.0]], [[(1, 2, 2, 0.0)]])
    metrics, _ = queue_figures("actor_rollout", [0, 1], [1, 1], [1, 1], traces, 1, 2, None, 1, [[0, 1]])
    assert "dp_balance/actor_rollout/static_s" not in metrics
    # no consumer returned rows at all: the measured figures only
    metrics, plan = queue_figures("actor_rollout", [0, 1], [1, 1], [1, 1], [], 2, 2, None, 1, [[0], [1]])
    assert metrics["dp_balance/actor_rollout/stage_s"] == 0.0 and plan["sizes"] == [0, 0]
    assert "dp_balance/actor_rollout/static_s" not in metrics
    # under a second: the ratios are ratios
    traces = _traces([0.5, 0.3], [[0], [1]], [[0.25], [0.25]], [[(1, 2, 2, 0.25), (1, 1, 0, 0.25)], []])
    metrics, _ = queue_figures("actor_rollout", [0, 1], [1, 1], [2, 1], traces, 2, None, None, 2, [[0], [1]])
    assert metrics["dp_balance/actor_rollout/static_gain"] == pytest.approx(metrics["dp_balance/actor_rollout/static_s"]
                                                                            / 0.5)
    assert metrics["dp_balance/actor_rollout/static_gain"] != 1.0
    assert metrics["dp_balance/actor_rollout/bound_gap"] == pytest.approx(0.5 / 0.4 - 1)


@pytest.mark.parametrize("backend, rows_per_share", [("vllm", 2), ("hf", 2), ("hf", 8)])
def test_the_round_figures_come_from_the_dock_the_plan_and_the_planners_draw(backend, rows_per_share):
    plan = _plan(backend, rows_per_share=rows_per_share, max_num_seqs=3)
    docks = [_dock(plan), _dock(plan)]  # the same round twice: the planner draws the same split
    lengths = [3, 1, 4, 1, 5, 9, 2, 6]
    for dock in docks:  # a first round teaches the dock its prompts' lengths: the second has a prior
        dock.put_queued(GROUP, dock.queue_round(GROUP).order, [_made(list(range(8)), lengths)])
        dock.start_round({"prompts": [torch.arange(p) + 10 * i for i, p in enumerate((3, 5, 2, 4))]})
    queued = docks[0].queue_round(GROUP)
    assert queued.prior[::N] == [2.0, 2.5, 7.0, 4.0]
    docks[0].put_queued(GROUP, queued.order, [_made([0, 1, 2, 3], lengths[:4]), _made([4, 5, 6, 7], lengths[4:])])
    traces = _traces([1.0, 1.5], [[0, 1, 2, 3], [4, 5, 6, 7]], [[0.1] * 4, [0.2] * 4],
                     [[(1, 2, 3, 0.01), (1, 3, 0, 0.02)], [(1, 1, 0, 0.01), (2, 3, 4, 0.05)]])
    metrics, record = rollout_figures(docks[0], plan.stages[ROLLOUT.name], queued, traces)
    split = [np.arange(8)[s] for s in docks[1].planner.random_split(8, 8 // rows_per_share)]  # one call a share
    chunk, take_cap = (None, rows_per_share) if backend == "vllm" else (rows_per_share, None)
    want, want_record = queue_figures(ROLLOUT.name, list(range(8)), [3, 3, 5, 5, 2, 2, 4, 4], lengths, traces, 2,
                                      chunk, take_cap, 3, split, queued.groups, queued.prior)
    assert metrics == want and record == want_record
    assert static_calls([[1], [2], [3]], 2) == [[[1], [3]], [[2]]]


def test_a_multi_turn_round_adds_the_tool_figures_and_is_not_replayed():
    prompt, resp = np.array([4, 4, 4]), np.array([8, 2, 6])
    records = [_records(COST, [(1, 2, 4), (1, 1, 0)]), _records(COST, [(2, 1, 2)])]
    traces = _traces([6.0, 4.0], [[0, 1], [2]], [[3.0, 1.0], [2.0]], records)
    traces[0]["tools"], traces[1]["tools"] = [2.0, 1.5], [2.0, 0.5]
    metrics, plan = queue_figures("actor_rollout", [0, 1, 2], prompt, resp, traces, 2, None, 2, 2, [[0, 1], [2]])
    key = lambda stat: f"dp_balance/actor_rollout/{stat}"  # noqa: E731
    assert metrics[key("busy_while_tools")] == pytest.approx(2.0 / 4.0)
    assert metrics[key("tool_share")] == pytest.approx(4.0 / 10.0)
    assert plan["tools"] == {"running": [2.0, 2.0], "busy": [1.5, 0.5]} and plan["lower_bound"] == 5.0
    assert key("static_s") not in metrics and key("replay_s") not in metrics  # tool time is not modelled
    assert plan["random_loads"] == plan["loads"] == [6.0, 4.0]


def test_the_bound_is_the_longest_row_of_any_engine():
    traces = _traces([4.0, 2.0], [[0], [1]], [[3.5], [1.0]], [[], []])
    metrics, plan = queue_figures("actor_rollout", [0, 1], [1, 1], [1, 1], traces, 2, None, None, 2, [[0], [1]])
    # the mean busy time is 3 s; the first engine's row took 3.5 s, no split ends earlier
    assert metrics["dp_balance/actor_rollout/bound_s"] == plan["lower_bound"] == 3.5


def test_tool_figures_of_rounds_whose_tools_took_no_time_or_an_engine_reported_none():
    key = lambda stat: f"dp_balance/actor_rollout/{stat}"  # noqa: E731

    def figures(busy, tools):
        traces = _traces(busy, [[0], [1]], [[0.0], [0.0]], [[], []])
        for t, value in zip(traces, tools):
            if value is not None:
                t["tools"] = value
        return queue_figures("actor_rollout", [0, 1], [1, 1], [1, 1], traces, 2, None, None, 2, [[0], [1]])

    # tools that took no time: no busy fraction (nothing to divide by), a share of 0
    metrics, plan = figures([2.0, 1.0], [[0.0, 0.0], [0.0, 0.0]])
    assert key("busy_while_tools") not in metrics and metrics[key("tool_share")] == 0.0
    # engines that were never busy: a share of 0, not a division by zero
    metrics, _ = figures([0.0, 0.0], [[0.0, 0.0], [0.0, 0.0]])
    assert metrics[key("tool_share")] == 0.0
    # fractions of a second count
    metrics, _ = figures([0.25, 0.5], [[0.5, 0.25], None])
    assert metrics[key("busy_while_tools")] == pytest.approx(0.5) and metrics[key("tool_share")] == pytest.approx(
        0.5 / 0.75)
    # an engine that reported no tool figures ran no tools: it adds nothing to either sum
    metrics, plan = figures([3.0, 1.0], [[2.0, 1.0], None])
    assert metrics[key("busy_while_tools")] == pytest.approx(0.5) and metrics[key("tool_share")] == pytest.approx(0.5)
    assert plan["tools"] == {"running": [2.0, 0.0], "busy": [1.0, 0.0]}
