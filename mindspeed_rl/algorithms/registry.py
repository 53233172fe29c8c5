"""Name -> function registries of what an algorithm is: advantage estimators, policy losses, driver stages.

A function is registered once under its name (and any aliases); the run plan looks a name up before Ray
starts, so an unknown name stops the run with one line naming the config key and the known names.
"""
import difflib
from typing import Any, Callable, Dict, Sequence, Tuple


def did_you_mean(name, known: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known`` to a misspelled ``name``, else ''."""
    close = difflib.get_close_matches(str(name), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Registry:
    def __init__(self, what: str, key: str):
        self.what, self.key = what, key  # what is registered; the config key that names an entry
        self.functions: Dict[str, Callable] = {}  # name -> function (tests may swap one in)
        self._meta: Dict[str, Dict[str, Any]] = {}
        self._alias: Dict[str, str] = {}

    def register(self, name: str, aliases: Tuple[str, ...] = (), **meta) -> Callable[[Callable], Callable]:
        """Decorator: ``fn`` under ``name`` (and ``aliases``) with metadata ``meta`` (read by ``meta(name)``)."""
        def decorator(fn: Callable) -> Callable:
            for key in (name,) + tuple(aliases):
                known = self.functions.get(self._alias.get(key, key))
                if known is not None and known is not fn:
                    raise ValueError(f"{self.what} {key!r} is registered already ({known.__module__}.{known.__name__})")
            self.functions[name], self._meta[name] = fn, dict(meta)
            self._alias.update({a: name for a in aliases})
            return fn
        return decorator

    def canonical(self, name: str) -> str:
        """The registered name of ``name`` (an alias resolves to its entry); ValueError when unknown."""
        name = self._alias.get(name, name)
        if name not in self.functions:
            raise ValueError(f"{self.key}={name!r} is not a known {self.what}{did_you_mean(name, self.names())}; "
                             f"known: {self.names()}")
        return name

    def get(self, name: str) -> Callable:
        return self.functions[self.canonical(name)]

    def meta(self, name: str) -> Dict[str, Any]:
        return dict(self._meta[self.canonical(name)])

    def names(self) -> list:
        return sorted(self.functions) + sorted(self._alias)

    def __contains__(self, name: str) -> bool:
        return self._alias.get(name, name) in self.functions


ADV_ESTIMATORS = Registry("advantage estimator", "rl_config.adv_estimator")
POLICY_LOSSES = Registry("policy loss", "rl_config.loss_mode")
DRIVER_STAGES = Registry("driver stage function", "the stage table's driver row")

# verl's names for the same verbs
register_adv_est = ADV_ESTIMATORS.register
get_adv_estimator_fn = ADV_ESTIMATORS.get
register_policy_loss = POLICY_LOSSES.register
get_policy_loss_fn = POLICY_LOSSES.get
register_stage = DRIVER_STAGES.register
