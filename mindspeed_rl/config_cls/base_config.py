"""Strict, typed config objects filled from plain dicts.

A subclass declares every accepted key as an instance attribute in its
``__init__``; the value assigned there is the default and also fixes the type
that later values must have (a None default: the types in key_types.py).
``update`` refuses keys that were not declared and values whose type does not
match.
"""
from collections.abc import Mapping

from mindspeed_rl.config_cls.key_types import section_of, unset_types


def _type_name(t) -> str:
    return {bool: "bool", int: "int", float: "float (or int)", dict: "dict"}.get(t, t.__name__)


def _expected_name(default, types=None) -> str:
    if default is None:
        names = [_type_name(t) for t in types]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float (or int)"
    if isinstance(default, Mapping):
        return "dict"
    return type(default).__name__


def _fits(t, value):
    """``value`` as type ``t`` (ints widened for float), or None when it does not fit."""
    if t is bool:
        return value if isinstance(value, bool) else None
    if t is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if t is float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if t is dict:
        return value if isinstance(value, Mapping) else None
    return value if isinstance(value, t) else None


def check_type(owner, key, default, value, types=None):
    """Return ``value`` if it fits the type of ``default``, else raise TypeError naming ``section.key``
    (``owner`` is a config class, named by its section, or a section name), the expected type and the value.

    Ints given for a float key are widened to float. A default of None takes None or one of
    ``types`` (default: key_types' entry of ``owner``; no entry: any value).
    """
    if default is None:
        types = types or unset_types(owner, key)
        if value is None or not types:
            return value
        wanted = types
    else:
        wanted = (bool,) if isinstance(default, bool) else (int,) if isinstance(default, int) else \
            (float,) if isinstance(default, float) else (dict,) if isinstance(default, Mapping) else (type(default),)
    for t in wanted:
        fitted = _fits(t, value)
        if fitted is not None:
            return fitted
    raise TypeError(f"{section_of(owner)}.{key} expects {_expected_name(default, types)}, "
                    f"got {value!r} ({type(value).__name__})")


def merge_sub_dict(owner, key, current, given, allowed):
    """Merge ``given`` into a copy of ``current`` for a dict-valued key.

    ``allowed`` maps every accepted sub-key to its default (used for the
    type check). Unknown sub-keys raise ValueError naming ``key.sub``.
    """
    if not isinstance(given, Mapping):
        raise TypeError(f"{section_of(owner)}.{key} expects dict, got {given!r} ({type(given).__name__})")
    merged = dict(current or {})
    for sub, value in given.items():
        sub = str(sub).replace("-", "_")
        if sub not in allowed:
            raise ValueError(f"{owner}: unknown key '{key}.{sub}'; "
                             f"allowed: {sorted(allowed)}")
        merged[sub] = check_type(owner, f"{key}.{sub}", allowed[sub], value)
    return merged


class BaseConfig:
    """Common behaviour of the config classes (see module docstring)."""

    def _declared_defaults(self):
        # Snapshot the declared defaults once, before the first update, so
        # the expected type of a key never drifts after values are assigned.
        snap = self.__dict__.get("_defaults")
        if snap is None:
            snap = {k: v for k, v in vars(self).items() if not k.startswith("_")}
            self.__dict__["_defaults"] = snap
        return snap

    def update(self, config_dict, model_config_dict=None):
        """Assign the values of ``config_dict`` to the declared attributes.

        Dashes in keys become underscores. A ``model: <name>`` entry first
        applies ``model_config_dict[<name>]``, so the other keys of
        ``config_dict`` override the model section.
        """
        owner = type(self).__name__
        defaults = self._declared_defaults()
        if config_dict is None:
            return
        if not isinstance(config_dict, Mapping):
            raise TypeError(f"{owner}: expected a mapping of settings, got "
                            f"{type(config_dict).__name__}")

        model_name = config_dict.get("model")
        if model_name is not None:
            if not isinstance(model_name, str):
                raise TypeError(f"{owner}: key 'model' expects str, got {model_name!r}")
            if not model_config_dict or model_name not in model_config_dict:
                known = sorted(model_config_dict or {})
                raise ValueError(f"{owner}: model '{model_name}' is not defined; "
                                 f"known models: {known}")
            self.update(model_config_dict[model_name])

        for key, value in config_dict.items():
            if key == "model":
                continue
            name = str(key).replace("-", "_")
            if name not in defaults:
                raise ValueError(f"{owner}: unknown key '{name}'. Check the "
                                 f"spelling or declare it in {owner}.")
            setattr(self, name, check_type(owner, name, defaults[name], value))

    def dict(self):
        """Return a new dict of the public settings."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def items(self):
        return self.dict().items()

    def __repr__(self):
        return f"<{type(self).__name__} {self.dict()}>"
