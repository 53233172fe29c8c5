"""The driver stages' math (compute_utils): the KL controller, DAPO's overlong penalty, weighted reward
functions, the reward stage's metrics and columns, and the group-normalised advantages."""
import json
import math

import pytest
import torch

from mindspeed_rl.plan.run_plan import OverlongSpec, StagePlan
from mindspeed_rl.plan.stages import FILTER_METRIC, GROUP_ADV, REWARD
from mindspeed_rl.trainer.utils import compute_utils as cu
from mindspeed_rl.data.columnar import ColumnBatch, unpadded_rows
from mindspeed_rl.data.driver_dock import DriverDock


class Fn:
    """A reward function: fixed scores, an optional weight, per-row verifier scores and metrics."""

    def __init__(self, scores, weight=None, last_scores=None, last_metrics=None):
        self.scores = scores
        if weight is not None:
            self.weight = weight
        if last_scores is not None:
            self.last_scores = last_scores
        if last_metrics is not None:
            self.last_metrics = last_metrics
        self.calls = []

    def __call__(self, responses, labels):
        self.calls.append(([t.tolist() for t in responses], [t.tolist() for t in labels]))
        return self.scores


def run_advantage(dock, stage, n_samples):
    """The advantage stage's registered function with the run's default estimator (group_norm), on ``dock``."""
    from types import SimpleNamespace

    from mindspeed_rl.algorithms.spec import AdvantageSpec
    from mindspeed_rl.trainer.driver_stages import compute_advantage
    trainer = SimpleNamespace(transfer_dock=dock, iteration=1,
                              run_plan=SimpleNamespace(advantage=AdvantageSpec(), n_samples=n_samples),
                              reward_guard=SimpleNamespace(check_advantages=lambda *a: None))
    return compute_advantage(trainer, stage)


def test_adaptive_kl_scales_by_the_relative_error_steps_and_horizon():
    ctrl = cu.AdaptiveKLController(0.5, target_kl=2.0, horizon=40)
    ctrl.update(2.2, 8)  # error 2.2 / 2 - 1 = 0.1 (inside the clip)
    assert ctrl.value == pytest.approx(0.5 * (1 + 0.1 * 8 / 40))
    ctrl = cu.AdaptiveKLController(0.5, target_kl=2.0, horizon=40)
    ctrl.update(0.2, 8)  # error -0.9, clipped to -0.2
    assert ctrl.value == pytest.approx(0.5 * (1 - 0.2 * 8 / 40))
    ctrl = cu.AdaptiveKLController(0.5, target_kl=2.0, horizon=1)
    ctrl.update(0.0, 5)  # 1 - 0.2 * 5 = 0: exactly zero, not below
    assert ctrl.value == pytest.approx(0.0, abs=1e-12) and ctrl.value >= 0.0
    for horizon in (0, -3):
        with pytest.raises(ValueError, match=rf"^kl_horizon must be positive, got {horizon}$"):
            cu.AdaptiveKLController(0.1, 1.0, horizon)
    assert cu.AdaptiveKLController(0.1, 1.0, 1).horizon == 1  # the smallest horizon is valid


def test_overlong_penalty_is_zero_until_the_buffer_then_linear_and_capped():
    lengths = torch.tensor([0, 12, 13, 16, 20, 21, 400])
    got = cu.overlong_penalty(lengths, buffer=8, penalty_factor=2.0, max_tokens=20)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.25, -1.0, -2.0, -2.0, -2.0])
    assert got.dtype == torch.float32


def test_verifier_scores_come_from_the_first_function_that_has_them():
    silent = Fn([0.0])  # no last_scores attribute
    empty = Fn([0.0], last_scores={})
    other = Fn([0.0], last_scores={"format": [1, 1]})
    acc = Fn([0.0], last_scores={"accuracy": [[1, 0], [0, 1]]})
    later = Fn([0.0], last_scores={"accuracy": [9, 9, 9, 9]})
    none = Fn([0.0], last_scores=None)
    none.last_scores = None  # present but None: skipped
    got = cu.verifier_scores([silent, none, empty, other, acc, later], "accuracy")
    assert got.dtype == torch.float32 and got.tolist() == [1.0, 0.0, 0.0, 1.0]  # flattened, as floats
    with pytest.raises(ValueError, match=r"^rl_config\.filter_groups_metric='length': no reward function gave "
                                         r"per-row scores under that name$"):
        cu.verifier_scores([silent, other, acc], "length")


def test_score_rows_sums_each_function_times_its_weight_and_merges_their_metrics():
    responses = [torch.tensor([1, 2]), torch.tensor([3])]
    labels = [torch.tensor([7]), torch.tensor([8])]
    plain = Fn(torch.tensor([[1.0], [3.0]]), last_metrics={"acc/frac": 0.5})  # no weight: 1; (2, 1) flattened
    weighted = Fn([2, -1], weight=0.25, last_metrics={"fmt/frac": 1.0, "acc/frac": 0.75})
    total, metrics = cu.score_rows([plain, weighted], responses, labels)
    assert total.tolist() == pytest.approx([1.0 + 0.5, 3.0 - 0.25])
    assert metrics == {"acc/frac": 0.75, "fmt/frac": 1.0}  # later functions' metrics win
    assert plain.calls == [([[1, 2], [3]], [[7], [8]])]  # each function sees every response with its label
    alone, _ = cu.score_rows([Fn([4, 5], weight=3)], responses, labels)
    assert alone.tolist() == [12.0, 15.0] and alone.dtype == torch.float32


def test_score_rows_refuses_no_functions_and_a_wrong_count():
    with pytest.raises(ValueError, match=r"^no reward function: give at least one \(rl_config\.verifier_function\)$"):
        cu.score_rows([], [torch.ones(1)], [torch.ones(1)])
    with pytest.raises(ValueError, match=r"^reward Fn gave 3 scores for 2 responses$"):
        cu.score_rows([Fn([1.0, 2.0]), Fn([1, 2, 3])], [torch.ones(1)] * 2, [torch.ones(1)] * 2)


def test_data_metrics_are_plain_floats_a_json_log_takes():
    batch = {"response_length": [torch.tensor([4]), torch.tensor([10])], "prompt_length": [torch.tensor([3])] * 2}
    metrics = cu.data_metrics(batch)
    assert all(isinstance(v, float) for v in metrics.values())
    assert json.loads(json.dumps(metrics)) == {"response_length/mean": 7.0, "response_length/max": 10.0,
                                               "response_length/min": 4.0, "prompt_length/mean": 3.0}


def test_reward_and_data_metrics():
    assert cu.reward_stats(torch.tensor([1.0, -2.0, 4.0])) == {"reward/mean": 1.0, "reward/max": 4.0,
                                                              "reward/min": -2.0}
    batch = {"response_length": [torch.tensor([4]), torch.tensor([10]), torch.tensor([1])],
             "prompt_length": [torch.tensor([2]), torch.tensor([2]), torch.tensor([5])]}
    assert cu.data_metrics(batch) == {"response_length/mean": 5.0, "response_length/max": 10.0,
                                      "response_length/min": 1.0, "prompt_length/mean": 3.0}


def test_advantage_stats():
    stats = cu.advantage_stats(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    assert stats == pytest.approx({"advantages/mean": 0.0, "advantages/std": math.sqrt(2 / 3),
                                   "advantages/zero_frac": 0.5})
    two = cu.advantage_stats(torch.tensor([1.0, -1.0]))  # two values: the sample std, sqrt(2)
    assert two["advantages/std"] == pytest.approx(math.sqrt(2))
    assert cu.advantage_stats(torch.tensor([3.0])) == {"advantages/mean": 3.0, "advantages/std": 0.0,
                                                      "advantages/zero_frac": 0.0}


def _reward_dock(lengths, n=2, filter_metric=False):
    rows = len(lengths)
    extra = (FILTER_METRIC,) if filter_metric else ()
    stage = StagePlan(REWARD.name, rows, 1, False, stage=REWARD, inputs=REWARD.inputs, extra_outputs=extra)
    dock = DriverDock(rows // n, n, experience_columns=["prompts", "prompt_length", "labels", "responses",
                                                        "response_length", "rm_scores", FILTER_METRIC, "advantages"])
    prompts = [torch.ones(2 + g, dtype=torch.long) for g in range(rows // n)]
    dock.put_prompts_experience({"prompts": prompts, "labels": [torch.tensor([g]) for g in range(rows // n)]},
                                ["labels"])
    dock.put_experience({"responses": [torch.ones(k, dtype=torch.long) for k in lengths],
                         "response_length": torch.tensor(lengths)}, list(range(rows)))
    return dock, stage


def _column(dock, name):
    return [float(t) for t in dock.get_rows([name], list(range(dock.max_len)))[name]]


def test_reward_stage_adds_the_overlong_penalty_and_reports_it():
    lengths = [2, 9, 10, 6]
    dock, stage = _reward_dock(lengths)
    spec = OverlongSpec(buffer=4, penalty_factor=1.0, max_tokens=10)  # free up to 6 tokens
    metrics = cu.compute_rewards(dock, stage, [Fn([1.0, 1.0, 0.0, 0.5])], overlong=spec)
    assert _column(dock, "rm_scores") == pytest.approx([1.0, 0.25, -1.0, 0.5])
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx((-0.75 - 1.0) / 4)
    assert metrics["reward/overlong_penalty/frac"] == 0.5
    assert metrics["reward/mean"] == pytest.approx(0.75 / 4) and metrics["reward/min"] == -1.0
    assert metrics["response_length/max"] == 10.0 and metrics["prompt_length/mean"] == 2.5
    assert "reward/nonfinite" not in metrics
    plain = cu.compute_rewards(dock, stage, [Fn([1.0, 1.0, 0.0, 0.5])])  # no spec: no penalty, no metric
    assert _column(dock, "rm_scores") == [1.0, 1.0, 0.0, 0.5]
    assert not any(k.startswith("reward/overlong") for k in plain)


def test_reward_stage_names_the_first_non_finite_score():
    dock, stage = _reward_dock([1, 2, 3, 4])
    metrics = cu.compute_rewards(dock, stage, [Fn([0.0, float("nan"), 1.0, float("-inf")])])
    assert metrics["reward/nonfinite"] == 2.0
    assert metrics["reward/first_nonfinite_row"] == 1.0 and math.isnan(metrics["reward/first_nonfinite_value"])
    dock, stage = _reward_dock([1, 2, 3, 4])
    metrics = cu.compute_rewards(dock, stage, [Fn([0.0, 1.0, 2.0, float("inf")])])
    assert (metrics["reward/nonfinite"], metrics["reward/first_nonfinite_row"],
            metrics["reward/first_nonfinite_value"]) == (1.0, 3.0, float("inf"))


def test_reward_stage_with_a_filter_metric_writes_that_verifiers_own_scores():
    dock, stage = _reward_dock([1, 2, 3, 4], filter_metric=True)
    fn = Fn([2.0, 0.0, 2.0, 2.0], weight=0.5, last_scores={"accuracy": [1, 0, 1, 1]})
    cu.compute_rewards(dock, stage, [fn], filter_metric="accuracy")
    assert _column(dock, "rm_scores") == [1.0, 0.0, 1.0, 1.0]
    assert _column(dock, FILTER_METRIC) == [1.0, 0.0, 1.0, 1.0]
    # the stage writes the filter column but no metric was named: refused, nothing written
    dock, stage = _reward_dock([1, 2, 3, 4], filter_metric=True)
    with pytest.raises(ValueError, match=r"^stage 'rule_reward' writes \['rm_scores', 'metric_for_dapo'\]; got 1 "
                                         r"columns \(filter_metric=None\)$"):
        cu.compute_rewards(dock, stage, [fn])
    assert not bool(dock.experience_data_status["rm_scores"].any())


def test_group_advantages_are_normalised_within_each_group_and_reported():
    dock, _ = _reward_dock([1, 1, 1, 1, 1, 1], n=3)
    cu.put_columns(dock, {"rm_scores": torch.tensor([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])}, list(range(6)))
    stage = StagePlan(GROUP_ADV.name, 6, 1, False, stage=GROUP_ADV, inputs=GROUP_ADV.inputs)
    stats = run_advantage(dock, stage, 3)
    adv = _column(dock, "advantages")
    assert adv[:3] == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)  # (x - mean) / (std + eps), std = 1
    assert adv[3:] == [0.0, 0.0, 0.0]  # an all-equal group has no signal
    assert stats["advantages/zero_frac"] == pytest.approx(4 / 6)
    assert stats["advantages/mean"] == pytest.approx(0.0, abs=1e-6)


def test_put_columns_takes_numbers_per_row_and_flat_rows_as_they_are():
    calls = []

    class Dock:
        def put_experience(self, data, rows):
            calls.append((data, rows))

    padded = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    cu.put_columns(Dock(), {"rm_scores": torch.tensor([0.5, -1.0]), "old_log_prob": unpadded_rows(padded, [2, 1])},
                   [4, 7])
    (data, rows), = calls
    assert isinstance(data, ColumnBatch) and rows == [4, 7]
    assert [t.tolist() for t in data["rm_scores"]] == [[0.5], [-1.0]]  # rows of shape (1,)
    assert [t.tolist() for t in data["old_log_prob"]] == [[1.0, 2.0], [3.0]]


def test_upstream_stage_names_resolve_from_compat_and_others_do_not():
    from mindspeed_rl.compat import compute_utils as upstream
    assert cu.compute_advantage is upstream.compute_advantage
    with pytest.raises(AttributeError, match=r"^module 'mindspeed_rl\.trainer\.utils\.compute_utils' has no "
                                             r"attribute 'nothing_here'$"):
        cu.nothing_here  # noqa: B018
