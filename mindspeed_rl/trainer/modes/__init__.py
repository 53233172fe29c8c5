"""Trainer modes: one step function per ``rl_config.trainer_mode`` (plan/trainer_mode.py), registered by
name (modes/registry.py). A step runs one iteration on the trainer: it makes the iteration's train rows with the row
parts it needs (a fresh batch, partial rollout's pool, dynamic sampling's filter; modes/rounds.py) and trains on
them."""
from mindspeed_rl.trainer.modes import sync  # noqa: F401  (registers)
from mindspeed_rl.trainer.modes.registry import STEPS, mode_step, register_mode  # noqa: F401  (re-exported)
from mindspeed_rl.trainer.modes import async_modes  # noqa: F401,E402  (registers colocate_async, separate_async)
