"""Trainer modes: one step function per ``rl_config.trainer_mode`` (config_cls/trainer_mode.py), registered by
name. A step runs one iteration on the trainer: it makes the iteration's train rows with the row parts it needs
(a fresh batch, partial rollout's pool, dynamic sampling's filter; trainer/modes/rounds.py) and trains on them."""
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


from mindspeed_rl.trainer.modes import sync  # noqa: E402,F401  (registers)
