"""``rl_config.trainer_mode``: how rollout and training share an iteration (verl's v1 trainer modes, by name).

    sync            rollout, then training, each iteration (the default; partial rollout and dynamic sampling
                    are parts of it, alone or together)
    colocate_async  one step off: rollout engines beside each trainer rank on the same devices; the next batch
                    is sampled with the weights of the step before while the trainer trains; weights go to the
                    engines after every step
    separate_async  rollout engines on devices of their own; they run up to ``max_staleness`` weight versions
                    ahead of the trainer, finished batches wait in a buffer, weights go to the engines every
                    ``parameter_sync_step`` steps

Keys of the async modes (rl_config): ``parameter_sync_step`` (1), ``max_staleness`` (1: a row is trained at most
this many weight versions after the weights that sampled it), ``num_warmup_batches`` (0: iterations run in step
before the engines run ahead), ``drop_stale_rows`` (false: a group with a token older than max_staleness versions,
which partial rollout's carried rows can hold, is trained with the rollout correction; true: it is dropped). Both
are counted. The step functions are in trainer/modes; this module checks the keys."""
from dataclasses import dataclass
from typing import Optional, Tuple

from mindspeed_rl.algorithms.registry import did_you_mean

SYNC = "sync"
COLOCATE = "colocate_async"
SEPARATE = "separate_async"
KNOWN: Tuple[str, ...] = (SYNC, COLOCATE, SEPARATE)
ASYNC_KEYS = ("parameter_sync_step", "max_staleness", "num_warmup_batches", "drop_stale_rows")
DEFAULTS = (1, 1, 0, False)


@dataclass(frozen=True)
class AsyncSpec:
    """The async modes' schedule: weights reach the engines after every ``sync_step``-th update; the engines run
    ``ahead`` batches beyond the one the trainer takes next (0 during the first ``warmup`` iterations), so a row is
    at most ``ahead + sync_step - 1`` = ``max_staleness`` versions old when trained (dynamic sampling's refills
    can draw further ahead, and partial rollout carries tokens across versions; those rows are counted, and
    dropped with ``drop_stale``)."""
    mode: str
    sync_step: int = 1
    max_staleness: int = 1
    warmup: int = 0
    drop_stale: bool = False

    @property
    def ahead(self) -> int:
        return self.max_staleness - (self.sync_step - 1)

    @property
    def colocated(self) -> bool:
        return self.mode == COLOCATE


def _whole(value, key: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"rl_config.{key}={value!r} must be a whole number >= {least}")
    return value


def trainer_mode(rl_config) -> str:
    """The run's mode; ValueError (one line naming the key) on an unknown one."""
    value = rl_config.trainer_mode
    if value not in KNOWN:
        raise ValueError(f"rl_config.trainer_mode={value!r} is not one of {list(KNOWN)}{did_you_mean(value, KNOWN)}")
    return value


def async_spec(rl_config) -> Optional[AsyncSpec]:
    """The checked schedule of an async mode (None under sync, where the async keys must keep their defaults)."""
    mode = trainer_mode(rl_config)
    given = (rl_config.parameter_sync_step, rl_config.max_staleness, rl_config.num_warmup_batches,
             rl_config.drop_stale_rows)
    if mode == SYNC:
        moved = [(k, v) for k, v, d in zip(ASYNC_KEYS, given, DEFAULTS) if v != d]
        if moved:
            raise ValueError(f"rl_config.{moved[0][0]}={moved[0][1]!r} applies to the async trainer modes; with "
                             f"trainer_mode=sync leave it out (or set trainer_mode)")
        return None
    step, staleness, warmup = (_whole(v, k, least) for v, k, least in zip(given, ASYNC_KEYS, (1, 0, 0)))
    if not isinstance(given[3], bool):
        raise ValueError(f"rl_config.drop_stale_rows={given[3]!r} must be true or false")
    if mode == COLOCATE and (step, staleness) != (1, 1):
        raise ValueError(f"rl_config.trainer_mode=colocate_async is one step off: parameter_sync_step=1 and "
                         f"max_staleness=1 (got {step} and {staleness}); for other schedules use separate_async")
    if staleness < step - 1:
        raise ValueError(f"rl_config.max_staleness={staleness} is below parameter_sync_step - 1 = {step - 1}: "
                         f"rows sampled just before a sync are trained {step - 1} versions later")
    return AsyncSpec(mode, step, staleness, warmup, given[3])
