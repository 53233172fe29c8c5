"""Upstream's module path of RayDAPOTrainer: the stage-table trainer under its name. DAPO's parts are the
loss switches (worker spec), the overlong penalty (reward stage) and dynamic sampling
(trainer/dynamic_sampling.py), each chosen by its rl_config key under any stage."""
from mindspeed_rl.trainer.dynamic_sampling import kept_groups  # noqa: F401
from mindspeed_rl.trainer.stage_trainer import StageTableTrainer

RayDAPOTrainer = StageTableTrainer
