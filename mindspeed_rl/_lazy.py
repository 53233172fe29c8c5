"""Lazy package exports: a name is imported from its module on first access."""
import importlib


def lazy_exports(package: str, exports: dict):
    """``__getattr__`` and ``__dir__`` for ``package``; ``exports`` maps name -> module."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(importlib.import_module(package), name, value)  # cache on the package
        return value

    def __dir__():
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
