"""Upstream's path of its padding helpers; they live in mindspeed_rl.compat.pad_process (a face: this name is that
module object, named by string so utils imports nothing above it)."""
import importlib
import sys

sys.modules[__name__] = importlib.import_module("mindspeed_rl.compat.pad_process")
