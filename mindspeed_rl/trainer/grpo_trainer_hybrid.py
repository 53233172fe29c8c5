"""Upstream's module path of RayGRPOTrainer: the stage-table trainer (trainer/stage_trainer.py) under its name."""
from mindspeed_rl.trainer.stage_trainer import (ENGINES, NONFINITE_KEYS, CheckpointSaveError,  # noqa: F401
                                                NonFiniteError, StageTableTrainer, first_nonfinite,
                                                rank_timing_metrics, skipped_steps, verifier_fault_lines)

RayGRPOTrainer = StageTableTrainer
