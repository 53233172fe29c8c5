"""Driver rows run their registered functions; a row whose function (or worker method) is missing stops the
run before Ray starts with one line naming the row; dynamic sampling runs under any trainer stage."""
import dataclasses

import pytest

from cli.train_grpo import worker_classes
from mindspeed_rl.algorithms import DRIVER_STAGES
from mindspeed_rl.plan.loader import build_configs, load_config
from mindspeed_rl.trainer.driver_stages import check_stage_functions
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.trainer.stage_trainer import StageTableTrainer
from mindspeed_rl.trainer.dapo_trainer_hybrid import RayDAPOTrainer
from mindspeed_rl.trainer.ppo_trainer_hybrid import RayPPOTrainer
from ut.dapo.test_dapo_sampling import DAPO, TINY, _trainer, batches, local  # noqa: F401  (fixture)


def _plan(*overrides):
    return build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides])).plan


def test_upstreams_trainer_names_are_the_one_trainer():
    assert RayGRPOTrainer is RayDAPOTrainer is RayPPOTrainer is StageTableTrainer


def test_every_built_in_row_has_its_function():
    for overrides in ([], DAPO[1:], ["rl_config.adv_estimator=rloo"]):
        check_stage_functions(_plan(*overrides), worker_classes())


def test_a_driver_row_without_a_function_is_named(monkeypatch):
    plan = _plan()
    monkeypatch.delitem(DRIVER_STAGES.functions, "compute_advantage")
    with pytest.raises(ValueError, match=r"stage 'compute_advantage' of the run plan names driver function "
                                         r"'compute_advantage', which is not registered"):
        check_stage_functions(plan, worker_classes())


def test_a_dp_row_whose_worker_lacks_the_method_is_named():
    plan = _plan()
    name = next(s.name for s in plan.stages.values() if s.is_dp and not getattr(s, "queued", False))
    stage = plan.stages[name]
    odd = dataclasses.replace(stage, stage=dataclasses.replace(stage.stage, method="no_such_method"))
    with pytest.raises(ValueError, match=f"stage '{name}' of the run plan runs 'no_such_method' on role"):
        check_stage_functions(dataclasses.replace(plan, stages={**plan.stages, name: odd}), worker_classes())


def test_dynamic_sampling_runs_under_stage_ray_grpo(local):
    trainer, _ = _trainer("megatron_training.stage=ray_grpo")
    data = batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    assert m["dapo/train_groups"] == 6 and m["dapo/rollout_batches"] >= 2


class NoQueue:
    """A worker class with every planned method of the actor's rows but not the rollout queue's."""

    generate_sequences = compute_log_prob = compute_ref_log_prob = update = staticmethod(lambda *a, **k: None)


def test_a_queued_rollout_needs_its_queue_method_and_the_message_names_the_class():
    plan = _plan()  # the rollout is served from the round's queue (guarantee_order false)
    with pytest.raises(ValueError, match=r"stage 'actor_rollout' of the run plan runs 'serve_sequences' on role "
                                         r"'actor', which its worker class NoQueue does not have"):
        check_stage_functions(plan, {"actor": NoQueue})
    check_stage_functions(_plan("rl_config.guarantee_order=true"), {"actor": NoQueue})  # fixed shares: no queue


def test_each_role_is_checked_against_its_own_class_and_ref_against_the_actors():
    ppo = build_configs(load_config(TINY.parent / "ppo_tiny_cpu.yaml",
                                    ["megatron_training.model_path=/unused", "rl_config.init_kl_coef=0.1"])).plan
    assert {s.role for s in ppo.stages.values() if s.is_dp} == {"actor", "ref", "critic"}
    check_stage_functions(ppo, worker_classes())  # no 'ref' class given: the reference runs on the actor's
    with pytest.raises(ValueError, match="runs 'compute_values' on role 'critic', which its worker class "
                                         "IntegratedWorker does not have"):
        check_stage_functions(ppo, {**worker_classes(), "critic": worker_classes()["actor"]})


def test_the_correction_row_hands_the_dock_its_stage_and_the_plans_correction_spec(monkeypatch):
    from types import SimpleNamespace

    from mindspeed_rl.trainer import driver_stages
    calls = []
    monkeypatch.setattr(driver_stages.correction_stage, "compute_rollout_correction",
                        lambda *a: calls.append(a) or {"ok": 1.0})
    from mindspeed_rl.trainer.utils.reward_guard import RejectionGuard
    trainer = SimpleNamespace(transfer_dock=object(), run_plan=SimpleNamespace(correction=object()), iteration=1,
                              rejection_guard=RejectionGuard())
    stage = object()
    assert DRIVER_STAGES.get("compute_rollout_correction")(trainer, stage) == {"ok": 1.0}
    assert calls == [(trainer.transfer_dock, stage, trainer.run_plan.correction)]


def test_a_role_without_a_worker_class_is_named():
    with pytest.raises(ValueError, match=r"stage 'actor_rollout' of the run plan runs 'generate_sequences' on role "
                                         r"'actor', which its worker class None does not have"):
        check_stage_functions(_plan(), {})
