"""Rollout correction that leaves no token to train on: the fraction of tokens still trained on, one warning per
such iteration, and a stop before the update after rl_config.max_all_rejected_iterations of them in a row."""
import dataclasses
import sys
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.algorithms import DRIVER_STAGES
from mindspeed_rl.trainer import driver_stages  # noqa: F401  (registers the driver stages)
from mindspeed_rl.plan.rollout_correction import CorrectionSpec, correction_spec
from mindspeed_rl.plan.stages import ROLLOUT_CORR, ROLLOUT_LOG_PROBS
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.models.loss.rollout_correction import TRAINED_FRACTION, RejectRule, correct
from mindspeed_rl.trainer.utils.reward_guard import AllRejectedError, RejectionGuard, nothing_trained
from tests.ut.trainer.test_long_tail_dock import N, _plan

TIGHT = CorrectionSpec(None, 2.0, None, (RejectRule("token_k1", 1.001, 0.999),))
ICEPOP = CorrectionSpec("token", 1.5, 0.8)


def _correct(old, roll, spec, mask=None):
    old, roll = torch.tensor([old], dtype=torch.float64), torch.tensor([roll], dtype=torch.float64)
    return correct(old, roll, torch.ones_like(old) if mask is None else torch.tensor([mask]), spec)[2]


def test_the_trained_fraction_counts_kept_tokens_with_a_non_zero_weight():
    assert _correct([0.0, -1.0, 0.0, 0.0], [0.0] * 4, TIGHT)[TRAINED_FRACTION] == 0.75
    assert _correct([-1.0, 1.0], [0.0, 0.0], TIGHT)[TRAINED_FRACTION] == 0.0  # every token rejected
    assert _correct([-1.0, 1.0, 0.0], [0.0] * 3, ICEPOP)[TRAINED_FRACTION] == pytest.approx(1 / 3)  # weighed 0
    assert _correct([-1.0, 1.0], [0.0, 0.0], ICEPOP)[TRAINED_FRACTION] == 0.0
    assert TRAINED_FRACTION not in _correct([0.0], [0.0], TIGHT, mask=[0.0])  # no real token: nothing to say


def test_what_left_nothing_is_said_in_words():
    assert nothing_trained({TRAINED_FRACTION: 0.5}, TIGHT) is None and nothing_trained({}, TIGHT) is None
    assert nothing_trained(_correct([-1.0, 1.0], [0.0, 0.0], TIGHT), TIGHT) == (
        "rollout correction rejected 100.0% of its tokens (rejection token_k1 in [0.999, 1.001])")
    assert nothing_trained(_correct([-1.0, 1.0], [0.0, 0.0], ICEPOP), ICEPOP) == (
        "rollout correction weighed every token 0 (token-level IS weights [0.8, 1.5] (outside: 0))")
    both = CorrectionSpec("token", 1.5, 0.8, (RejectRule("token_k2", 0.1),))
    # one token rejected (k2 = 2), the other weighed 0 (ratio e^-0.4 below 0.8)
    assert nothing_trained(_correct([-2.0, -0.4], [0.0, 0.0], both), both) == (
        "rollout correction rejected 50.0% of its tokens and weighed the others 0 (token-level IS weights "
        "[0.8, 1.5] (outside: 0); rejection token_k2 <= 0.1)")


def test_a_round_without_rejection_rules_that_trains_nothing_weighed_every_token_0():
    assert nothing_trained({TRAINED_FRACTION: 0.0}, ICEPOP) == (
        "rollout correction weighed every token 0 (token-level IS weights [0.8, 1.5] (outside: 0))")


def test_the_stop_names_the_first_iteration_of_the_streak_and_warnings_are_flushed_at_once(capsys, monkeypatch):
    guard = RejectionGuard(2)
    guard.check(1, {TRAINED_FRACTION: 0.0}, ICEPOP)
    with pytest.raises(AllRejectedError, match=r"^rollout correction weighed every token 0 \(token-level IS "
                                               r"weights \[0.8, 1.5\] \(outside: 0\)\) in 2 iterations in a row"):
        guard.check(2, {TRAINED_FRACTION: 0.0, "rollout_corr/rollout_rs_masked_fraction": 1.0}, TIGHT)
    from tests.ut.faults.test_reward_guard_edges import Stdout
    out = Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    RejectionGuard(0).check(3, {TRAINED_FRACTION: 0.0}, ICEPOP)
    assert "warning: iteration 3" in out.text and out.flushed == 1


def test_each_such_iteration_warns_and_the_limit_stops_the_run(capsys):
    none = {TRAINED_FRACTION: 0.0, "rollout_corr/rollout_rs_masked_fraction": 1.0}
    guard = RejectionGuard(3)
    guard.check(1, none, TIGHT)
    guard.check(2, none, TIGHT)
    out = capsys.readouterr().out.splitlines()
    assert out == [f"warning: iteration {i}: rollout correction rejected 100.0% of its tokens (rejection token_k1 in "
                   f"[0.999, 1.001]): its update learns nothing ({i} of 3 in a row allowed)" for i in (1, 2)]
    guard.check(3, {TRAINED_FRACTION: 0.2}, TIGHT)  # a round that trains ends the streak
    guard.check(4, none, TIGHT)
    guard.check(5, none, TIGHT)
    capsys.readouterr()
    with pytest.raises(AllRejectedError) as err:
        guard.check(6, none, TIGHT)
    assert str(err.value) == (
        "rollout correction rejected 100.0% of its tokens (rejection token_k1 in [0.999, 1.001]) in 3 iterations in a "
        "row (4-6) (rl_config.max_all_rejected_iterations=3): the policy loss, its gradient and the KL would all be "
        "0, so the run stops before the update; loosen rl_config.rollout_correction's thresholds")
    assert capsys.readouterr().out == ""
    never = RejectionGuard(0)
    for it in range(1, 5):
        never.check(it, none, TIGHT)
    assert capsys.readouterr().out.count("its update learns nothing\n") == 4  # 0: never stops, says it each time
    assert RejectionGuard().limit == 1
    for limit in (True, -1, 1.5):
        with pytest.raises(ValueError, match=r"rl_config.max_all_rejected_iterations must be an int >= 0, got"):
            RejectionGuard(limit)


def test_the_correction_stage_stops_before_the_update_when_every_token_is_rejected(capsys):
    plan = dataclasses.replace(_plan(), correction=correction_spec(
        {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.999_1.001"}, partial=False))
    dock = DriverDock(4, N, run_plan=plan)
    dock.put_experience({"prompts": [torch.arange(2)] * 2, "old_log_prob": [torch.tensor([-0.5, -1.0]),
                                                                            torch.tensor([-0.1])],
                         ROLLOUT_LOG_PROBS: [torch.tensor([-0.9, -0.4]), torch.tensor([-0.3])],
                         "response_length": torch.tensor([2, 1])}, [0, 1])
    trainer = SimpleNamespace(transfer_dock=dock, run_plan=plan, iteration=7, rejection_guard=RejectionGuard(2))
    stage = plan.stages[ROLLOUT_CORR.name]
    metrics = DRIVER_STAGES.get("compute_rollout_correction")(trainer, stage)
    assert metrics[TRAINED_FRACTION] == 0.0
    assert capsys.readouterr().out.startswith("warning: iteration 7: rollout correction rejected 100.0% of its")
    trainer.iteration = 8
    with pytest.raises(AllRejectedError, match=r"in 2 iterations in a row \(7-8\)"):
        DRIVER_STAGES.get("compute_rollout_correction")(trainer, stage)
