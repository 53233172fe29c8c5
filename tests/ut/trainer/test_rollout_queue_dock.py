"""The dock's side of the rollout queue: the round it loads, the one checked write of what the engines made,
the prompts' lengths it keeps for the next rounds, and the round's balance figures."""
import dataclasses

import numpy as np
import pytest
import torch

from mindspeed_rl.config_cls.rollout_spec import RolloutSpec
from mindspeed_rl.config_cls.run_plan import Layout, RunPlan, StagePlan
from mindspeed_rl.config_cls.stages import ROLLOUT
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.trainer.utils.rollout_balance import queue_figures, rollout_figures, static_calls
from mindspeed_rl.trainer.utils.transfer_dock import DriverDock
from mindspeed_rl.utils.rollout_cost import StepCost, simulate_static
from mindspeed_rl.utils.seqlen_balancing import imbalance

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
    ([_made([0, 1, 2, 3], [1] * 4), _made([3, 4, 5, 6, 7], [1] * 5)], "row 3 was made by consumers 0 and 1"),
    ([_made([0, 1, 2, 3], [1] * 4), _made([4, 5, 6], [1] * 3)], r"missing \[7\], not in the round \[\]"),
    ([_made([0, 1, 2, 3, 4, 5, 6, 7, 9], [1] * 9)], r"missing \[\], not in the round \[9\]"),
    ([_made([0, 1, 2, 3], [1] * 4), ([4, 5, 6, 7], {"responses": [torch.ones(1)] * 4})],
     "consumer 1: gave columns"),
    ([_made([0, 1, 2, 3], [1] * 4), ([4, 5, 6, 7], {"responses": [torch.ones(1)] * 3,
                                                    "response_length": [torch.ones(1)] * 4})],
     "consumer 1: column .response_length. has 4 rows, but .responses. has 3"),
])
def test_a_bad_put_names_the_consumer_or_row_and_writes_nothing(made, message):
    dock = _dock()
    queued = dock.queue_round(GROUP)
    with pytest.raises(ValueError, match=message):
        dock.put_queued(GROUP, queued.order, made)
    assert int(dock.experience_data_status["responses"].sum()) == 0
    assert dock.prompt_lengths.lengths == {}


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


def test_the_figures_measure_the_engines_and_replay_the_static_split():
    prompt, resp = np.array([4, 4, 4, 4]), np.array([6, 1, 1, 1])
    traces = [{"consumer": 0, "rows": [0], "busy": 6.0, "latency": [6.0], "trace": [(1, 1, 4, 1.0)] * 6},
              {"consumer": 1, "rows": [1, 2, 3], "busy": 3.0, "latency": [1.0] * 3, "trace": [(1, 1, 4, 1.0)] * 3}]
    metrics, plan = queue_figures("actor_rollout", [0, 1, 2, 3], prompt, resp, traces, 2, None, None, 1,
                                  [[0, 1], [2, 3]])
    key = "dp_balance/actor_rollout/"
    assert metrics[key + "rank_imbalance"] == pytest.approx(imbalance([6.0, 3.0]))
    assert metrics[key + "rank0"] == 6.0 and metrics[key + "rows/rank1"] == 3.0
    assert metrics[key + "bound_s"] == 6.0 and metrics[key + "bound_gap"] == 0.0
    # every step took a second: the static split of [0, 1] / [2, 3] runs 7 and 2 steps
    assert metrics[key + "cost_per_step_ms"] == pytest.approx(1000.0)
    assert metrics[key + "static_s"] == pytest.approx(7.0) and plan["random_loads"] == pytest.approx([7.0, 2.0])
    assert metrics[key + "static_gain"] == pytest.approx(7 / 6)
    assert plan["loads"] == [6.0, 3.0] and plan["sizes"] == [1, 3] and plan["served"] == "queue"


def test_untimed_traces_give_the_measured_figures_only():
    traces = [{"consumer": 0, "rows": [0, 1], "busy": 0.0, "latency": [0.0, 0.0], "trace": []}]
    metrics, plan = queue_figures("actor_rollout", [0, 1], [1, 1], [1, 1], traces, 1, 2, None, 1, [[0, 1]])
    assert "dp_balance/actor_rollout/static_s" not in metrics and plan["random_loads"] == [0.0]


def test_the_static_split_is_the_planners_draw_of_the_round():
    dock = _dock(_plan(max_num_seqs=2))
    queued = dock.queue_round(GROUP)
    dock.put_queued(GROUP, queued.order, [_made(list(range(8)), [3, 1, 4, 1, 5, 9, 2, 6])])
    traces = [{"consumer": 0, "rows": list(range(8)), "busy": 1.0, "latency": [0.1] * 8,
               "trace": [(1, 2, 0, 0.01)] * 10},
              {"consumer": 1, "rows": [], "busy": 0.5, "latency": [], "trace": [(1, 1, 0, 0.01)]}]
    twin = _dock(_plan(max_num_seqs=2))  # the same round: the planner draws the same split
    split = twin.planner.random_split(8, 2)
    metrics, plan = rollout_figures(dock, dock.run_plan.stages[ROLLOUT.name], queued, traces)
    expected = simulate_static([3, 3, 5, 5, 2, 2, 4, 4], [3, 1, 4, 1, 5, 9, 2, 6], static_calls(split, 2),
                               StepCost(0.01, 0.0, 0.0), cap=2)
    assert plan["random_loads"] == pytest.approx(expected.busy.tolist())
    assert static_calls([[1], [2], [3]], 2) == [[[1], [3]], [[2]]]
