"""Trainer helpers: the transfer dock and driver-side computations."""
from mindspeed_rl._lazy import lazy_exports

_COMPUTE = "mindspeed_rl.trainer.utils.compute_utils"
_DOCK = "mindspeed_rl.trainer.utils.transfer_dock"
_EXPORTS = {
    "AdaptiveKLController": _COMPUTE,
    "FixedKLController": _COMPUTE,
    "compute_advantage": _COMPUTE,
    "get_last_reward": _COMPUTE,
    "compute_grpo_data_metrics": _COMPUTE,
    "TransferDock": _DOCK,
    "GRPOTransferDock": _DOCK,
    "DriverDock": _DOCK,
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
