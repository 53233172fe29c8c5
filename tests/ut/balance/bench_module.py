"""A benchmark script imported as a module for its tests, leaving the environment and import path as they were
(the scripts set vLLM's environment and their own import path when imported)."""
import importlib
import os
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def import_benchmark(name: str):
    env, path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
