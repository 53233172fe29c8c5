"""Trainer modes: rl_config.trainer_mode's checks, the step registry, and the pool metrics of several takes in one
iteration (dynamic sampling on partial rollout)."""
from pathlib import Path

import pytest

from mindspeed_rl.config_cls import build_configs, load_config
from mindspeed_rl.config_cls.run_plan import PlanError
from mindspeed_rl.config_cls.trainer_mode import LIVE
from mindspeed_rl.trainer.modes import mode_step, register_mode, registry, sync
from mindspeed_rl.trainer.partial_rollout import merge_takes

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"


def _plan(*overrides):
    return build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides])).plan


def test_sync_is_the_default_and_steps_with_its_registered_function():
    assert _plan().trainer_mode == "sync" == _plan("rl_config.trainer_mode=sync").trainer_mode
    assert mode_step("sync") is sync.step
    assert sorted(LIVE) == sorted(registry.STEPS)  # the key accepts exactly the modes that have a step


@pytest.mark.parametrize("value, message", [
    ("separate_async", "rl_config.trainer_mode='separate_async' is not implemented yet: only ['sync'] runs (rollout, "
                       "then training, each iteration)"),
    ("colocate_async", "rl_config.trainer_mode='colocate_async' is not implemented yet: only ['sync'] runs (rollout, "
                       "then training, each iteration)"),
    ("sycn", "rl_config.trainer_mode='sycn' is not one of ['sync', 'colocate_async', 'separate_async'] (did you mean "
             "'sync'?)"),
])
def test_other_modes_are_one_line_before_anything_starts(value, message):
    with pytest.raises(PlanError) as err:
        _plan(f"rl_config.trainer_mode={value}")
    assert str(err.value) == message


def test_a_mode_that_is_no_string_is_refused_by_its_type():
    with pytest.raises(TypeError, match=r"^rl_config.trainer_mode expects str, got 7 \(int\)$"):
        _plan("rl_config.trainer_mode=7")


def test_a_mode_registers_once_and_an_unknown_one_is_named(monkeypatch):
    monkeypatch.setattr(registry, "STEPS", dict(registry.STEPS))
    register_mode("other")(len)
    assert mode_step("other") is len
    with pytest.raises(ValueError, match="trainer mode 'other' is registered twice"):
        register_mode("other")(len)
    with pytest.raises(ValueError, match=r"trainer mode 'nope' has no step function; registered: \['other', 'sync'\]"):
        mode_step("nope")


def _take(rows, tokens, mean, age_max, passes, carried):
    return {"partial_rollout/continued_rows": rows, "partial_rollout/continued_tokens": tokens,
            "partial_rollout/token_age_mean": mean, "partial_rollout/token_age_max": age_max,
            "partial_rollout/max_passes": passes, "partial_rollout/carried_rows": carried}


def test_the_pool_metrics_of_several_takes():
    one = _take(3.0, 10.0, 0.5, 4.0, 2.0, 7.0)
    assert merge_takes([one]) == one and merge_takes([one]) is not one
    takes = [one, _take(1.0, 4.0, 1.5, 3.0, 1.0, 2.0), _take(0.0, 1.0, 1.0, 1.0, 1.0, 5.0)]
    # counts add, maxima are the largest (the first take's here), the mean age is averaged, what the pool holds
    # after the iteration is the last take's
    assert merge_takes(takes) == _take(4.0, 15.0, 1.0, 4.0, 2.0, 5.0)
