"""Trainer modes: rl_config.trainer_mode's checks and the async modes' keys, the step registry, and the pool metrics
of several takes in one iteration (dynamic sampling on partial rollout)."""
from pathlib import Path

import pytest

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.run_plan import PlanError
from mindspeed_rl.plan.trainer_mode import KNOWN, AsyncSpec
from mindspeed_rl.trainer.modes import async_modes, mode_step, register_mode, registry, sync
from mindspeed_rl.trainer.partial_rollout import merge_takes

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"


def _plan(*overrides):
    return build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides])).plan


def test_sync_is_the_default_and_steps_with_its_registered_function():
    plan = _plan()
    assert plan.trainer_mode == "sync" == _plan("rl_config.trainer_mode=sync").trainer_mode
    assert plan.asynchronous is None and plan.roles == ("actor",)
    assert mode_step("sync") is sync.step
    assert sorted(KNOWN) == sorted(registry.STEPS)  # the key accepts exactly the modes that have a step
    assert mode_step("separate_async") is mode_step("colocate_async") is async_modes.step


LOGPROBS = "generate_config.sampling_config.logprobs=0"


def test_the_async_modes_plan_their_engines_schedule_and_correction():
    plan = _plan("rl_config.trainer_mode=separate_async", "rl_config.parameter_sync_step=2",
                 "rl_config.max_staleness=3", "rl_config.num_warmup_batches=1", LOGPROBS)
    assert plan.asynchronous == AsyncSpec("separate_async", 2, 3, 1) and plan.asynchronous.ahead == 2
    assert not plan.asynchronous.drop_stale
    dropping = _plan("rl_config.trainer_mode=separate_async", "rl_config.drop_stale_rows=true", LOGPROBS,
                     "rl_config.partial_rollout_max_split=2")
    assert dropping.asynchronous == AsyncSpec("separate_async", 1, 1, 0, True)
    assert not plan.asynchronous.colocated
    assert plan.roles == ("actor", "rollout")
    engines = plan.for_group("rollout")
    assert engines.layout.engine == "ddp" and engines.layout.world_size == plan.layout.world_size
    # older weights sample than train: token-level IS weights unless the user says otherwise
    assert plan.correction.rollout_is == "token" and plan.worker.rollout.returns_log_probs
    off = _plan("rl_config.trainer_mode=separate_async", "rl_config.rollout_correction={rollout_is: null}")
    assert off.correction.rollout_is is None
    edge = _plan("rl_config.trainer_mode=separate_async", "rl_config.parameter_sync_step=2",
                 "rl_config.max_staleness=1", LOGPROBS).asynchronous  # the least staleness a sync every 2 allows
    assert edge == AsyncSpec("separate_async", 2, 1, 0) and edge.ahead == 0
    one = _plan("rl_config.trainer_mode=colocate_async", LOGPROBS).asynchronous
    assert one == AsyncSpec("colocate_async", 1, 1, 0) and one.colocated and one.ahead == 1
    fsdp = _plan("rl_config.trainer_mode=separate_async", LOGPROBS, "megatron_training.use_distributed_optimizer=true")
    assert fsdp.for_group("rollout").layout.engine == "ddp" != fsdp.layout.engine


@pytest.mark.parametrize("overrides, message", [
    (["rl_config.trainer_mode=sycn"], "rl_config.trainer_mode='sycn' is not one of ['sync', 'colocate_async', "
                                      "'separate_async'] (did you mean 'sync'?)"),
    (["rl_config.max_staleness=2"], "rl_config.max_staleness=2 applies to the async trainer modes; with "
                                    "trainer_mode=sync leave it out (or set trainer_mode)"),
    (["rl_config.num_warmup_batches=1"], "rl_config.num_warmup_batches=1 applies to the async trainer modes; with "
                                         "trainer_mode=sync leave it out (or set trainer_mode)"),
    (["rl_config.trainer_mode=colocate_async", "rl_config.parameter_sync_step=2", LOGPROBS],
     "rl_config.trainer_mode=colocate_async is one step off: parameter_sync_step=1 and max_staleness=1 (got 2 and "
     "1); for other schedules use separate_async"),
    (["rl_config.trainer_mode=separate_async", "rl_config.parameter_sync_step=3", LOGPROBS],
     "rl_config.max_staleness=1 is below parameter_sync_step - 1 = 2: rows sampled just before a sync are trained "
     "2 versions later"),
    (["rl_config.trainer_mode=separate_async", "rl_config.parameter_sync_step=0", LOGPROBS],
     "rl_config.parameter_sync_step=0 must be a whole number >= 1"),
    (["rl_config.trainer_mode=separate_async", "rl_config.max_staleness=-1", LOGPROBS],
     "rl_config.max_staleness=-1 must be a whole number >= 0"),
    (["rl_config.trainer_mode=separate_async", LOGPROBS, "actor_config.tensor_model_parallel_size=2"],
     "rl_config.trainer_mode=separate_async runs one whole model per rollout engine: tensor parallelism "
     "(tensor_model_parallel_size=2) is not implemented for its engines yet"),
    (["rl_config.trainer_mode=colocate_async", LOGPROBS, "rl_config.partial_rollout_max_split=2",
      "rl_config.async_engine=true"],
     "rl_config.trainer_mode=colocate_async with rl_config.async_engine=true is not implemented: a pass stops on the "
     "groups the pool completes, which the passes in flight beside it change; leave async_engine false (the pool's "
     "passes already cut rows at pass_tokens and continue them with newer weights)"),
    (["rl_config.trainer_mode=separate_async", "rl_config.drop_stale_rows=true", LOGPROBS],
     "rl_config.drop_stale_rows acts on partial rollout's carried rows (partial_rollout_max_split > 1); whole batches "
     "are at most max_staleness versions old by the schedule (DAPO's refills are counted in async/over_bound_rows, "
     "not dropped): leave it out"),
    (["rl_config.drop_stale_rows=true"], "rl_config.drop_stale_rows=True applies to the async trainer modes; with "
                                         "trainer_mode=sync leave it out (or set trainer_mode)"),
])
def test_a_bad_mode_or_schedule_is_one_line_before_anything_starts(overrides, message):
    with pytest.raises(PlanError) as err:
        _plan(*overrides)
    assert str(err.value) == message


def test_a_schedule_key_that_is_no_whole_number_is_refused_by_its_type():
    with pytest.raises(TypeError, match=r"^rl_config.max_staleness expects int, got True \(bool\)$"):
        _plan("rl_config.trainer_mode=separate_async", "rl_config.max_staleness=true")


def test_drop_stale_rows_that_is_no_bool_is_refused_by_its_type():
    with pytest.raises(TypeError, match=r"^rl_config.drop_stale_rows expects bool, got 1 \(int\)$"):
        _plan("rl_config.trainer_mode=separate_async", "rl_config.drop_stale_rows=1")


def test_a_mode_that_is_no_string_is_refused_by_its_type():
    with pytest.raises(TypeError, match=r"^rl_config.trainer_mode expects str, got 7 \(int\)$"):
        _plan("rl_config.trainer_mode=7")


def test_a_mode_registers_once_and_an_unknown_one_is_named(monkeypatch):
    monkeypatch.setattr(registry, "STEPS", dict(registry.STEPS))
    register_mode("other")(len)
    assert mode_step("other") is len
    with pytest.raises(ValueError, match="trainer mode 'other' is registered twice"):
        register_mode("other")(len)
    with pytest.raises(ValueError, match=r"trainer mode 'nope' has no step function; registered: \['colocate_async', "
                                         r"'other', 'separate_async', 'sync'\]"):
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
