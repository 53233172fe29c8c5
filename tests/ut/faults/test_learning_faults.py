"""Runs that cannot learn say so: zero advantages by construction are found at plan time, and a
verifier that fails on every row stops the run (rl_config.max_failed_reward_iterations) before
the update, naming the verifier and its first error."""
import os

import pytest
import torch

from cli import train_grpo
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import GROUP_ADV, REWARD
from mindspeed_rl.plan.learning_signal import zero_advantage_reasons
from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.rewards.rule_reward import VerifierReward
from mindspeed_rl.models.tiny_model import build_toy_tokenizer
from mindspeed_rl.trainer import driver_stages, stage_trainer as hybrid
from mindspeed_rl.trainer.utils.reward_guard import RewardFailureError, RewardGuard, failed_everywhere

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs", "grpo_tiny_cpu.yaml")
BROKEN = "tests.ut.rewards.slow_verifier:always_raises"


# ------------------------------------------------------------------ zero advantages by construction

def test_zero_advantages_by_construction_are_named():
    assert zero_advantage_reasons(RLConfig({"n_samples_per_prompt": 4})) == []
    one = zero_advantage_reasons(RLConfig({"n_samples_per_prompt": 1}))
    assert len(one) == 1 and one[0].startswith("rl_config.n_samples_per_prompt=1 with adv_estimator group_norm")
    weights = zero_advantage_reasons(RLConfig({"n_samples_per_prompt": 4, "verifier_function": ["a", "b"],
                                               "verifier_weight": [0.0, 0]}))
    assert len(weights) == 1 and weights[0].startswith("rl_config.verifier_weight=[0.0, 0]: every reward is 0")
    # DAPO's overlong penalty still gives a length reward
    assert zero_advantage_reasons(RLConfig({"n_samples_per_prompt": 4, "verifier_weight": [0.0],
                                            "overlong_buffer_enable": True, "overlong_buffer": 4})) == []
    # PPO's GAE advantages are not normalised within groups
    assert zero_advantage_reasons(RLConfig({"n_samples_per_prompt": 1, "adv_estimator": "gae"})) == []


@pytest.mark.parametrize("override, said", [
    ("rl_config.n_samples_per_prompt=1", "rl_config.n_samples_per_prompt=1 with adv_estimator group_norm"),
    ("rl_config.verifier_weight=[0.0]", "rl_config.verifier_weight=[0.0]: every reward is 0"),
])
def test_dry_run_and_run_say_it_at_plan_time(override, said, capsys):
    extra = ["rl_config.mini_batch_size=2", "rl_config.n_samples_per_prompt=1"] if "n_samples" in override else []
    lines = train_grpo.dry_run(TINY, [override] + extra)
    notes = [line for line in lines if line.startswith("note: nothing can be learned")]
    assert len(notes) == 1 and said in notes[0]
    train_grpo._built_with_warnings(TINY, [override] + extra)  # what run() builds the configs with
    out = capsys.readouterr().out
    assert out.count("warning: nothing can be learned") == 1 and said in out
    with pytest.warns(UserWarning, match="nothing can be learned"):
        build_configs(load_config(TINY, [override] + extra))


# ------------------------------------------------------------------ a verifier failing on every row

def test_a_verifier_raising_on_every_row_is_counted_with_its_first_error():
    reward = VerifierReward([BROKEN], [1.0], eos_id=13, tokenizer=build_toy_tokenizer())
    try:
        scores = reward([torch.tensor([4, 5, 13])] * 3, [torch.tensor([1])] * 3)
    finally:
        reward.close()
    assert scores.tolist() == [0.0, 0.0, 0.0]
    failures = reward.last_failures[BROKEN]
    assert (failures["rows"], failures["errors"], failures["timeouts"]) == (3, 3, 0)
    assert failures["first_error"].startswith("ValueError: label ") and "is not a number" in failures["first_error"]
    assert failed_everywhere([reward]).startswith(f"verifier '{BROKEN}' failed on all 3 rows (3 raised, 0 timed "
                                                  f"out; the first error: ValueError: label")


class _Failing:
    """A reward whose verifier failed on ``failed`` of 4 rows in the last call."""

    def __init__(self, failed=4, weight=1.0):
        self.last_failures = {"v": {"rows": 4, "errors": failed, "timeouts": 0, "weight": weight,
                                    "first_error": "ValueError: bad label"}}


def test_guard_stops_at_the_limit_and_counts_iterations_in_a_row(capsys):
    with pytest.raises(RewardFailureError) as info:
        RewardGuard(1).check(5, [_Failing()])
    assert str(info.value) == ("the rewards failed on every row in iteration 5 (rl_config.max_failed_reward_"
                               "iterations=1): verifier 'v' failed on all 4 rows (4 raised, 0 timed out; the first "
                               "error: ValueError: bad label); training on reward 0 learns nothing, so the run "
                               "stops before the update")
    guard = RewardGuard(2)
    guard.check(1, [_Failing()])
    guard.check(1, [_Failing()])  # a DAPO refill of the same iteration counts once
    guard.check(2, [_Failing(failed=3)])  # some rows scored: the streak starts over
    guard.check(3, [_Failing()])
    with pytest.raises(RewardFailureError, match=r"in 2 iterations in a row \(3-4\)"):
        guard.check(4, [_Failing()])
    assert capsys.readouterr().out.count("(1 of 2 in a row allowed)") == 3
    never = RewardGuard(0)
    for it in range(1, 6):
        never.check(it, [_Failing()])
    assert capsys.readouterr().out.count("every row scores 0\n") == 5
    RewardGuard(1).check(1, [_Failing(weight=0.0)])  # a verifier of weight 0 changes no reward
    with pytest.raises(ValueError, match="max_failed_reward_iterations must be an int >= 0"):
        RewardGuard(-1)


def test_guard_says_when_every_advantage_is_zero(capsys):
    RewardGuard.check_advantages(7, {"advantages/zero_frac": 1.0})
    assert capsys.readouterr().out == ("warning: iteration 7: every advantage is 0 (the rewards are equal within "
                                       "every group): its update learns nothing\n")
    RewardGuard.check_advantages(7, {"advantages/zero_frac": 0.5})
    assert capsys.readouterr().out == ""


class EqualScores:
    """A dock whose rows all score 1 with 2 response tokens."""

    def __init__(self, rows):
        self.rows = rows

    def get_rows(self, columns, rows):
        return {"rm_scores": [torch.tensor(1.0)] * len(rows), "response_length": [torch.tensor(2)] * len(rows)}

    def put_experience(self, batch, rows):
        pass


def test_trainer_reward_stage_stops_before_the_update(monkeypatch, capsys):
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused"]))
    calls = []
    monkeypatch.setattr(driver_stages, "reward_stage", lambda *a, **k: calls.append(1) or {"reward/mean": 0.0})
    workers = object()  # no stage runs on them here
    trainer = hybrid.StageTableTrainer(actor_worker=workers, reward_list=[_Failing()], run_plan=cfgs.plan,
                                    max_failed_reward_iterations=1)
    trainer.took_batch(3)
    with pytest.raises(RewardFailureError, match="in iteration 3 "):
        driver_stages.compute_rewards(trainer, cfgs.plan.stages[REWARD.name])
    assert calls == [1]
    lenient = hybrid.StageTableTrainer(actor_worker=workers, reward_list=[_Failing()], run_plan=cfgs.plan,
                                    max_failed_reward_iterations=0)
    lenient.took_batch(1)
    assert driver_stages.compute_rewards(lenient, cfgs.plan.stages[REWARD.name]) == {"reward/mean": 0.0}
    capsys.readouterr()
    # the advantage stage says when none is left: equal scores within every group
    stage = cfgs.plan.stages[GROUP_ADV.name]
    lenient.transfer_dock = EqualScores(stage.rows_per_share)
    assert driver_stages.compute_advantage(lenient, stage)["advantages/zero_frac"] == 1.0
    assert capsys.readouterr().out.startswith("warning: iteration 1: every advantage is 0")


def test_config_key_is_typed_checked_and_reaches_the_trainer():
    assert RLConfig().max_failed_reward_iterations == 1
    with pytest.raises(ValueError, match="max_failed_reward_iterations must be an int >= 0"):
        RLConfig({"max_failed_reward_iterations": -1})
    with pytest.raises(TypeError, match="rl_config.max_failed_reward_iterations expects int"):
        RLConfig({"max_failed_reward_iterations": "never"})
    import inspect
    source = inspect.getsource(train_grpo._train)
    assert "max_failed_reward_iterations=rl.max_failed_reward_iterations" in source
    assert "max_nonfinite_iterations=rl.max_nonfinite_iterations" in source
