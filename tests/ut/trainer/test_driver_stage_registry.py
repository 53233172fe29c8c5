"""Driver rows run their registered functions; a row whose function (or worker method) is missing stops the
run before Ray starts with one line naming the row; dynamic sampling runs under any trainer stage."""
import dataclasses

import pytest

from cli.train_grpo import worker_classes
from mindspeed_rl.algorithms import DRIVER_STAGES
from mindspeed_rl.config_cls.loader import build_configs, load_config
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
