"""Upstream's module path of RayBaseTrainer: the stage-table trainer holds the driver state every algorithm shares."""
from mindspeed_rl.trainer.stage_trainer import StageTableTrainer

RayBaseTrainer = StageTableTrainer
