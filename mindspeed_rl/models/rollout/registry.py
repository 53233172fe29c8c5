"""Rollout backends by name. A backend is one module, ``models/rollout/<name>_backend.py``, whose factory is
registered with ``@register_backend("<name>")``: ``generate_config.rollout_backend: <name>`` then picks it. Names come
from the module files, so nothing is imported to list them; ``make_backend`` imports the one asked for on first use
(vLLM's import is heavy)."""
import importlib
import os
import pkgutil
from typing import Callable, Dict, Tuple

SUFFIX = "_backend"
_PACKAGE = __package__
_FOLDER = os.path.dirname(os.path.abspath(__file__))
# name -> factory(spec, actor, model_path, device, rank, world_size, seed, trust_remote_code) -> RolloutBackend
_FACTORIES: Dict[str, Callable] = {}


def register_backend(name: str):
    """Class or function decorator: the factory of backend ``name`` (one per name)."""
    def add(factory):
        if _FACTORIES.get(name, factory) is not factory:
            raise ValueError(f"rollout backend {name!r} is registered twice ({_FACTORIES[name]!r}, {factory!r})")
        _FACTORIES[name] = factory
        return factory
    return add


def backend_names() -> Tuple[str, ...]:
    """Every backend's name: the modules ``<name>_backend`` next to this one."""
    return tuple(sorted(m.name[:-len(SUFFIX)] for m in pkgutil.iter_modules([_FOLDER]) if m.name.endswith(SUFFIX)))


def make_backend(spec, actor, model_path: str, device, rank: int, world_size: int, seed: int,
                 trust_remote_code: bool = False):
    """The backend ``spec`` (plan.rollout_spec.RolloutSpec) names, over the actor engine ``actor``."""
    name = spec.backend
    known = backend_names()
    if name not in known:
        raise ValueError(f"unknown rollout backend {name!r}; known: {list(known)}")
    module = f"{_PACKAGE}.{name}{SUFFIX}"
    importlib.import_module(module)
    if name not in _FACTORIES:
        raise ValueError(f"{module} registers no rollout backend named {name!r} (@register_backend({name!r}))")
    return _FACTORIES[name](spec, actor, model_path, device, rank, world_size, seed, trust_remote_code)
