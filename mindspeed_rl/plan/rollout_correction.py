"""``rl_config.rollout_correction``: verl's ``algorithm.rollout_correction`` keys, checked into one spec.

Keys (verl's names and meanings): ``rollout_is`` (null | token | sequence), ``rollout_is_threshold`` (2.0; a
number truncates, 'lower_upper' zeroes outside the bounds), ``rollout_rs`` (null, or comma separated options of
models/loss/rollout_correction.RS_OPTIONS), ``rollout_rs_threshold`` (one per option, or one for all; k1 options
take 'lower_upper' or an upper bound u meaning [1/u, u]), ``bypass_mode`` (false: the trainer's old log-probs
against the engine's; true: the engine's log-probs are the old log-probs, the PPO ratio does the correction and
no old log-prob pass runs), ``loss_type`` (ppo_clip) and ``rollout_is_batch_normalize`` (false).
With partial rollout or an async trainer mode on, ``rollout_is`` defaults to 'token' (a carried row mixes tokens of
several policies; an async row was sampled by older weights).
"""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

from mindspeed_rl.models.loss.rollout_correction import RS_OPTIONS, RejectRule

KEYS = ("rollout_is", "rollout_is_threshold", "rollout_rs", "rollout_rs_threshold", "bypass_mode", "loss_type",
        "rollout_is_batch_normalize")
_SECTION = "rl_config.rollout_correction"


@dataclass(frozen=True)
class CorrectionSpec:
    rollout_is: Optional[str] = None      # 'token', 'sequence' or None
    is_upper: float = 2.0
    is_lower: Optional[float] = None      # IcePop's lower bound ('lower_upper' threshold)
    rules: Tuple[RejectRule, ...] = ()
    bypass_mode: bool = False

    @property
    def on(self) -> bool:
        return self.rollout_is is not None or bool(self.rules) or self.bypass_mode

    def describe(self) -> str:
        parts = []
        if self.rollout_is:
            bound = (f"[{self.is_lower:g}, {self.is_upper:g}] (outside: 0)" if self.is_lower is not None
                     else f"truncated at {self.is_upper:g}")
            parts.append(f"{self.rollout_is}-level IS weights {bound}")
        if self.rules:
            parts.append("rejection " + ", ".join(
                f"{r.option}{f' in [{r.lower:g}, {r.upper:g}]' if r.lower is not None else f' <= {r.upper:g}'}"
                for r in self.rules))
        if self.bypass_mode:
            parts.append("bypass mode (the engine's log-probs are the old log-probs)")
        return "rollout correction: " + "; ".join(parts)


def _bounds(key: str, spec, pair_ok: bool) -> Tuple[float, Optional[float]]:
    """(upper, lower or None) of a threshold: a positive number, or 'lower_upper' where ``pair_ok``."""
    if isinstance(spec, bool) or spec is None:
        raise ValueError(f"{_SECTION}.{key}={spec!r} must be a positive number"
                         + (" or a 'lower_upper' string" if pair_ok else ""))
    parts = str(spec).strip().split("_") if isinstance(spec, str) else [spec]
    try:
        if len(parts) > (2 if pair_ok else 1):
            raise ValueError
        values = [float(p) for p in parts]
    except (TypeError, ValueError):
        raise ValueError(f"{_SECTION}.{key}={spec!r} is not a number"
                         + (" or a 'lower_upper' pair" if pair_ok else "")) from None
    if not all(0 < v < math.inf for v in values):  # NaN fails every comparison
        raise ValueError(f"{_SECTION}.{key}={spec!r}: bounds must be finite and positive")
    if len(values) == 2:
        if values[0] > values[1]:
            raise ValueError(f"{_SECTION}.{key}={spec!r}: the lower bound exceeds the upper")
        return values[1], values[0]
    return values[0], None


def _rules(options, thresholds) -> Tuple[RejectRule, ...]:
    if options is None:
        return ()
    if not isinstance(options, str) or not options.strip():
        raise ValueError(f"{_SECTION}.rollout_rs={options!r} must be null or comma separated options of "
                         f"{list(RS_OPTIONS)}")
    names = list(dict.fromkeys(o.strip() for o in options.split(",") if o.strip()))
    unknown = [o for o in names if o not in RS_OPTIONS]
    if unknown:
        raise ValueError(f"{_SECTION}.rollout_rs: {unknown[0]!r} is not one of {list(RS_OPTIONS)}")
    if thresholds is None:
        raise ValueError(f"{_SECTION}.rollout_rs={options!r} needs rollout_rs_threshold")
    given = [t.strip() for t in thresholds.split(",")] if isinstance(thresholds, str) else [thresholds]
    if len(given) not in (1, len(names)):
        raise ValueError(f"{_SECTION}.rollout_rs_threshold gives {len(given)} thresholds for {len(names)} options "
                         f"(one for all, or one each)")
    given = given * len(names) if len(given) == 1 else given
    rules = []
    for name, threshold in zip(names, given):
        k1 = name.endswith("k1")
        upper, lower = _bounds("rollout_rs_threshold", threshold, pair_ok=k1)
        if k1 and lower is None:
            upper, lower = max(upper, 1 / upper), min(upper, 1 / upper)
        rules.append(RejectRule(name, upper, lower if k1 else None))
    return tuple(rules)


def correction_spec(raw, partial: bool) -> CorrectionSpec:
    """The checked spec of ``rl_config.rollout_correction`` (a mapping or None); ``partial``: partial rollout
    is on, so ``rollout_is`` defaults to 'token'."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ValueError(f"{_SECTION} must be a mapping of {list(KEYS)}, got {type(raw).__name__}")
    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise ValueError(f"{_SECTION}.{unknown[0]} is not a rollout correction key; known: {list(KEYS)}")
    level = raw.get("rollout_is", "token" if partial else None)
    if level not in (None, "token", "sequence"):
        raise ValueError(f"{_SECTION}.rollout_is={level!r} must be null, 'token' or 'sequence'")
    upper, lower = _bounds("rollout_is_threshold", raw.get("rollout_is_threshold", 2.0), pair_ok=True)
    if lower is None and upper < 1:  # YAML reads an unquoted 0.5_2 as the number 0.52
        raise ValueError(f"{_SECTION}.rollout_is_threshold={upper!r} would truncate every weight below 1; for the "
                         f"interval [lower, upper] write it quoted, e.g. '0.5_2'")
    bypass = raw.get("bypass_mode", False)
    for key, value in (("bypass_mode", bypass), ("rollout_is_batch_normalize",
                                                 raw.get("rollout_is_batch_normalize", False))):
        if not isinstance(value, bool):
            raise ValueError(f"{_SECTION}.{key}={value!r} must be true or false")
    if raw.get("rollout_is_batch_normalize", False):
        raise ValueError(f"{_SECTION}.rollout_is_batch_normalize=true is not implemented (weights are used as "
                         f"computed)")
    loss_type = raw.get("loss_type", "ppo_clip")
    if loss_type != "ppo_clip":
        raise ValueError(f"{_SECTION}.loss_type={loss_type!r}: only 'ppo_clip' is implemented")
    rules = _rules(raw.get("rollout_rs"), raw.get("rollout_rs_threshold"))
    if bypass and (level is not None and "rollout_is" in raw or rules):
        raise ValueError(f"{_SECTION}.bypass_mode=true takes the engine's log-probs as the old ones (the PPO ratio "
                         f"is the correction): set rollout_is and rollout_rs to null; weights or rejection on top "
                         f"of it are not implemented")
    if bypass:
        level = None
    return CorrectionSpec(level, upper, lower, rules, bypass)
