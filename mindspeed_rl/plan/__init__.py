"""The run plan: what a run does, derived once from the keys (mindspeed_rl.config_cls) and read by the launcher,
workers, trainer and dock: the DP x TP layout of each role, the stage table with rows per share and shares per
rank, the features on (DAPO, partial rollout, multi-turn, async modes, rollout correction), the worker spec, the
timeouts; and every check that spans more than one key. ``load_config`` + ``build_configs`` read a YAML into it.

Names load on first use."""
from mindspeed_rl._lazy import lazy_exports

_LOADER = "mindspeed_rl.plan.loader"
_PLAN = "mindspeed_rl.plan.run_plan"
_EXPORTS = {
    "ConfigError": _LOADER,
    "RunConfigs": _LOADER,
    "build_configs": _LOADER,
    "load_config": _LOADER,
    "PlanError": _PLAN,
    "RunPlan": _PLAN,
    "build_run_plan": _PLAN,
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
