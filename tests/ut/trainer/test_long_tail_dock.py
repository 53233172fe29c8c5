"""The dock under partial rollout (a round of rows that are not whole groups) and rollout correction's driver
stage (weights and kept tokens written back per row)."""
import dataclasses
import math

import pytest
import torch

from mindspeed_rl.plan.rollout_correction import CorrectionSpec
from mindspeed_rl.plan.run_plan import Layout, RunPlan, StagePlan
from mindspeed_rl.plan.stages import (IS_WEIGHTS, LOSS_MASK, RESPONSE_MASK, ROLLOUT, ROLLOUT_CORR,
                                           ROLLOUT_LOG_PROBS)
from mindspeed_rl.models.loss.rollout_correction import RejectRule
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.trainer.utils.correction_stage import compute_rollout_correction
from mindspeed_rl.data.driver_dock import DriverDock

N = 2


def _plan():
    rollout = StagePlan(ROLLOUT.name, 4, 1, False, stage=ROLLOUT, inputs=("prompts",), queued=True)
    corr = StagePlan(ROLLOUT_CORR.name, 8, 1, False, stage=ROLLOUT_CORR, inputs=ROLLOUT_CORR.inputs)
    return RunPlan(Layout(2, 2, 1), prompts_per_round=4, n_samples=N, mini_batch_rows=8, epochs=1, train_iters=1,
                   stages={ROLLOUT.name: rollout, ROLLOUT_CORR.name: corr})


def _made(rows, lengths):
    return rows, {"responses": [torch.ones(n, dtype=torch.int32) for n in lengths],
                  "response_length": [torch.tensor([n], dtype=torch.int32) for n in lengths]}


def test_a_partial_round_queues_by_the_given_groups_and_keeps_no_prompt_lengths():
    dock = DriverDock(4, N, run_plan=_plan())
    dock.put_experience({"prompts": [torch.arange(3)] * 3, "prompt_length": torch.tensor([3, 3, 3])}, [0, 1, 2])
    dock.set_queue_groups([0, 1, 1], [9.0, 0.0, 0.0])
    queued = dock.queue_round(StageGroup.of(ROLLOUT))
    assert (queued.order, queued.groups, queued.prior) == ([0, 1, 2], [0, 1, 1], [9.0, 0.0, 0.0])
    dock.put_queued(StageGroup.of(ROLLOUT), queued.order, [_made([0, 2], [1, 4]), _made([1], [2])])
    assert dock.prompt_lengths.lengths == {}  # continuations are not a prompt's length
    with pytest.raises(ValueError, match="2 queue groups for a round of 3 rows"):
        dock.set_queue_groups([0, 1], [0.0, 0.0])
        dock.queue_round(StageGroup.of(ROLLOUT))
    dock.clear()  # the next round forgets them
    dock.put_experience({"prompts": [torch.arange(2)] * 2, "prompt_length": torch.tensor([2, 2])}, [0, 1])
    assert dock.queue_round(StageGroup.of(ROLLOUT)).groups == [0, 0]


def test_the_correction_stage_writes_weights_and_kept_tokens_per_row():
    plan = dataclasses.replace(_plan(), correction=CorrectionSpec("token", 1.5, None, (RejectRule("token_k2", 0.1),)))
    dock = DriverDock(4, N, run_plan=plan)
    old = [torch.tensor([-0.5, -1.0, -0.2]), torch.tensor([-0.1]), torch.tensor([-2.0, -0.3])]
    roll = [torch.tensor([-0.9, -0.4, -0.2]), torch.tensor([-0.3]), torch.tensor([-2.0, -3.0])]
    dock.put_experience({"prompts": [torch.arange(2)] * 3, "old_log_prob": old, ROLLOUT_LOG_PROBS: roll,
                         "response_length": torch.tensor([3, 1, 2])}, [0, 1, 2])
    metrics = compute_rollout_correction(dock, plan.stages[ROLLOUT_CORR.name], plan.correction)
    got = dock.get_rows([IS_WEIGHTS, RESPONSE_MASK], [0, 1, 2])
    for row in range(3):
        ratios = (old[row] - roll[row]).tolist()
        assert got[IS_WEIGHTS][row].tolist() == pytest.approx([min(math.exp(r), 1.5) for r in ratios])
        assert got[RESPONSE_MASK][row].tolist() == [0.5 * r * r <= 0.1 for r in ratios]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 6)  # -0.6 and 2.7
    bad = DriverDock(4, N, run_plan=plan)
    bad.put_experience({"prompts": [torch.arange(2)], "old_log_prob": [torch.zeros(2)],
                        ROLLOUT_LOG_PROBS: [torch.zeros(3)], "response_length": torch.tensor([2])}, [0])
    with pytest.raises(ValueError, match="row 0 has 2 old log-probs, 3 rollout log-probs"):
        compute_rollout_correction(bad, plan.stages[ROLLOUT_CORR.name], plan.correction)


def test_a_stoppable_round_takes_the_rows_it_served_and_only_those():
    from mindspeed_rl.balance.rollout_queue import StopRule
    dock = DriverDock(4, N, run_plan=_plan())
    dock.put_experience({"prompts": [torch.arange(2)] * 4, "prompt_length": torch.tensor([2] * 4)}, [0, 1, 2, 3])
    rule = StopRule(1, [False] * 4, [False] * 4)
    dock.set_queue_groups([0, 0, 1, 1], [0.0] * 4, stop=rule)
    queued = dock.queue_round(StageGroup.of(ROLLOUT))
    assert queued.stop is rule and [p.tolist() for p in queued.batch["prompts"]] == [[0, 1]] * 4
    dock.put_queued(StageGroup.of(ROLLOUT), queued.order, [_made([0], [1]), _made([2], [3])])
    assert dock.rows_with("responses") == [0, 2]
    assert dock.round_rows() == 4
    with pytest.raises(ValueError, match="not in the round \\[7\\]"):  # served rows must still be the round's
        dock.put_queued(StageGroup.of(ROLLOUT), queued.order, [_made([7], [1])])
    with pytest.raises(ValueError, match="^rows_with: unknown columns"):
        dock.rows_with("no_such_column")
    plain = DriverDock(4, N, run_plan=_plan())  # without a stop rule every row must be made
    plain.put_experience({"prompts": [torch.arange(2)] * 2, "prompt_length": torch.tensor([2, 2])}, [0, 1])
    plain.set_queue_groups([0, 0], [0.0, 0.0])
    assert plain.queue_round(StageGroup.of(ROLLOUT)).stop is None
    with pytest.raises(ValueError, match="missing \\[1\\]"):
        plain.put_queued(StageGroup.of(ROLLOUT), [0, 1], [_made([0], [1])])


def test_a_row_whose_log_probs_agree_with_each_other_but_not_its_length_is_named():
    plan = dataclasses.replace(_plan(), correction=CorrectionSpec("token"))
    dock = DriverDock(4, N, run_plan=plan)
    dock.put_experience({"prompts": [torch.arange(2)] * 2, "old_log_prob": [torch.zeros(2), torch.zeros(2)],
                         ROLLOUT_LOG_PROBS: [torch.zeros(2), torch.zeros(2)],
                         "response_length": torch.tensor([2, 3])}, [0, 1])
    with pytest.raises(ValueError, match="row 1 has 2 old log-probs, 2 rollout log-probs and response_length 3"):
        compute_rollout_correction(dock, plan.stages[ROLLOUT_CORR.name], plan.correction)


def test_a_short_row_of_rollout_log_probs_is_named_even_when_not_the_longest():
    plan = dataclasses.replace(_plan(), correction=CorrectionSpec("token"))
    dock = DriverDock(4, N, run_plan=plan)
    dock.put_experience({"prompts": [torch.arange(2)] * 2, "old_log_prob": [-torch.ones(3), -torch.ones(2)],
                         ROLLOUT_LOG_PROBS: [-torch.ones(3), -torch.ones(1)],
                         "response_length": torch.tensor([3, 2])}, [0, 1])
    with pytest.raises(ValueError, match="row 1 has 2 old log-probs, 1 rollout log-probs and response_length 2"):
        compute_rollout_correction(dock, plan.stages[ROLLOUT_CORR.name], plan.correction)


def test_the_correction_keeps_no_tool_token_and_counts_only_model_tokens():
    # multi-turn: tool answers have no engine log-prob (0.0 there); they must neither train nor count
    plan = dataclasses.replace(_plan(), correction=CorrectionSpec("token", 1.5, None, ()))
    plan.stages[ROLLOUT.name] = dataclasses.replace(plan.stages[ROLLOUT.name], extra_outputs=(LOSS_MASK,))
    corr = plan.stages[ROLLOUT_CORR.name]
    corr = dataclasses.replace(corr, inputs=corr.inputs + (LOSS_MASK,))
    dock = DriverDock(4, N, run_plan=plan)
    old = [torch.tensor([-0.5, -1.0, -0.2]), torch.tensor([-0.1])]
    roll = [torch.tensor([-0.5, 0.0, -0.2]), torch.tensor([-0.1])]
    tools = [torch.tensor([1, 0, 1], dtype=torch.int8), torch.tensor([1], dtype=torch.int8)]
    dock.put_experience({"prompts": [torch.arange(2)] * 2, "old_log_prob": old, ROLLOUT_LOG_PROBS: roll,
                         "response_length": torch.tensor([3, 1]), LOSS_MASK: tools}, [0, 1])
    metrics = compute_rollout_correction(dock, corr, plan.correction)
    got = dock.get_rows([RESPONSE_MASK], [0, 1])
    assert got[RESPONSE_MASK][0].tolist() == [True, False, True] and got[RESPONSE_MASK][1].tolist() == [True]
    # the tool token's ratio exp(-1) would pull the weights' mean below 1; over model tokens it is exactly 1
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1.0)
