"""A config value as a checked plain python value, or a ValueError naming its key."""
import math


def number(name, value, kind, optional=False, positive=False):
    """``value`` as a plain ``kind`` (int or float), or a ValueError naming ``name``."""
    if value is None and optional:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and kind is int:
        ok = float(value).is_integer()
    if ok and kind is float:
        ok = math.isfinite(value)
    if ok and positive:
        ok = value > 0
    if not ok:
        what = {int: "an int", float: "a finite number"}[kind]
        raise ValueError(f"{name}={value!r} must be {what}{' > 0' if positive else ''}"
                         f"{' or unset' if optional else ''}")
    return kind(value)


def flag(name, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be true or false")
    return value


def text(name, value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r} must be a string")
    return value
