"""A tool's ``config`` mapping checked against the keys it knows, each with its default."""
from typing import Any, Dict, Mapping, Optional

# a tool config's ``type``: how the tool runs; only tools defined in Python (native) exist here
TOOL_TYPES = ("native",)


def _kind(default: Any) -> str:
    """What a key with this bool or str default takes."""
    return "true or false" if isinstance(default, bool) else "a string"


def type_problem(tool_type: Any) -> Optional[str]:
    """One line when ``config.type`` is not a supported tool type."""
    if tool_type in TOOL_TYPES:
        return None
    return f"type {tool_type!r} is not supported (only {', '.join(map(repr, TOOL_TYPES))})"


def settle_config(config: Optional[Mapping], defaults: Mapping[str, Any]) -> Dict[str, Any]:
    """``defaults`` updated by ``config``; a key not in ``defaults`` (other than ``type``), a value of another
    type than its default's, or a number that is not > 0 raises ValueError naming the key.
    A default of None accepts a string or None."""
    config = dict(config or {})
    problem = type_problem(config.pop("type", "native"))
    if problem:
        raise ValueError(f"config {problem}")
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise ValueError(f"config key {unknown[0]!r} is not known (known: {', '.join(sorted(defaults))}, type)")
    settled = dict(defaults)
    for key, value in config.items():
        default = defaults[key]
        if default is None:
            ok = value is None or isinstance(value, str)
            want = "a string"
        elif isinstance(default, bool) or isinstance(default, str):
            ok, want = type(value) is type(default), _kind(default)
        else:  # a number: int defaults take ints, float defaults take both
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and \
                (isinstance(default, float) or isinstance(value, int))
            want = "a whole number" if isinstance(default, int) else "a number"
            if ok and value <= 0:
                raise ValueError(f"config {key} must be > 0, got {value}")
        if not ok:
            raise ValueError(f"config {key} must be {want}, got {value!r}")
        settled[key] = value
    return settled
