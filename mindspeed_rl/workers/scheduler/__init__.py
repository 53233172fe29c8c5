"""Worker-group scheduling on Ray."""
from mindspeed_rl._lazy import lazy_exports

_EXPORTS = {"RayActorGroup": "mindspeed_rl.workers.scheduler.launcher"}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
