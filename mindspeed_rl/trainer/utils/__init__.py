"""Trainer helpers: the driver's transfer dock and driver-side computations
(upstream's dock and stage adapters come from mindspeed_rl.compat)."""
from mindspeed_rl._lazy import lazy_exports

_COMPUTE = "mindspeed_rl.algorithms.kl"
_COMPAT_COMPUTE = "mindspeed_rl.compat.compute_utils"
_COMPAT_DOCK = "mindspeed_rl.compat.transfer_dock"
_EXPORTS = {
    "AdaptiveKLController": _COMPUTE,
    "FixedKLController": _COMPUTE,
    "compute_advantage": _COMPAT_COMPUTE,
    "get_last_reward": _COMPAT_COMPUTE,
    "compute_grpo_data_metrics": _COMPAT_COMPUTE,
    "TransferDock": _COMPAT_DOCK,
    "GRPOTransferDock": _COMPAT_DOCK,
    "DriverDock": "mindspeed_rl.data.driver_dock",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
