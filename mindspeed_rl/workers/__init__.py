"""Ray workers and their launcher."""
from mindspeed_rl._lazy import lazy_exports

_EXPORTS = {
    "RayActorGroup": "mindspeed_rl.workers.scheduler.launcher",
    "RuleReward": "mindspeed_rl.workers.rule_reward",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
