"""Upstream's path of validate_rl_args; the checks across configs live with the run plan (mindspeed_rl.plan.validate,
imported on first use)."""
from mindspeed_rl._lazy import lazy_exports

_HOME = "mindspeed_rl.plan.validate"
__getattr__, __dir__ = lazy_exports(__name__, {"validate_rl_args": _HOME, "check_rl_args": _HOME,
                                               "write_derived": _HOME})
