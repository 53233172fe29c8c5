"""The step function of each trainer mode, registered by name (``rl_config.trainer_mode``)."""
from typing import Callable, Dict

STEPS: Dict[str, Callable] = {}


def register_mode(name: str):
    def add(fn: Callable) -> Callable:
        if name in STEPS:
            raise ValueError(f"trainer mode {name!r} is registered twice")
        STEPS[name] = fn
        return fn
    return add


def mode_step(name: str) -> Callable:
    """The step function of mode ``name``."""
    try:
        return STEPS[name]
    except KeyError:
        raise ValueError(f"trainer mode {name!r} has no step function; registered: {sorted(STEPS)}") from None
