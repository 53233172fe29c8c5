"""Driver-side trainers."""
from mindspeed_rl._lazy import lazy_exports

_EXPORTS = {"RayGRPOTrainer": "mindspeed_rl.trainer.grpo_trainer_hybrid",
            "StageTableTrainer": "mindspeed_rl.trainer.stage_trainer"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
