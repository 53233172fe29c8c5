"""``rl_config.trainer_mode``: how rollout and training share an iteration (verl's v1 trainer modes, by name).

    sync            rollout, then training, each iteration (the default; partial rollout and dynamic sampling
                    are parts of it, alone or together)
    colocate_async  one step off: the next batch's rollout runs with the weights of the step before while the
                    trainer trains (not implemented yet)
    separate_async  engines and trainer on their own resources, a replay buffer between them (not implemented yet)

The step function of each mode is registered in trainer/modes; this module only checks the key."""
from typing import Tuple

from mindspeed_rl.algorithms.registry import did_you_mean

SYNC = "sync"
KNOWN: Tuple[str, ...] = (SYNC, "colocate_async", "separate_async")
LIVE: Tuple[str, ...] = (SYNC,)


def trainer_mode(rl_config) -> str:
    """The run's mode; ValueError (one line naming the key) on an unknown or not yet implemented one."""
    value = rl_config.trainer_mode
    if value not in KNOWN:
        raise ValueError(f"rl_config.trainer_mode={value!r} is not one of {list(KNOWN)}{did_you_mean(value, KNOWN)}")
    if value not in LIVE:
        raise ValueError(f"rl_config.trainer_mode={value!r} is not implemented yet: only {list(LIVE)} runs "
                         f"(rollout, then training, each iteration)")
    return value
