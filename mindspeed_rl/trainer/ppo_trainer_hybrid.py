"""Upstream's module path of RayPPOTrainer: the stage-table trainer under its name. A PPO plan holds the
critic's rows (values, GAE, critic update); the trainer then needs ``critic_worker``."""
from mindspeed_rl.trainer.stage_trainer import StageTableTrainer

RayPPOTrainer = StageTableTrainer
