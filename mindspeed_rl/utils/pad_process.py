"""Upstream's path of its padding helpers; they live in mindspeed_rl.compat.pad_process (this name is that
module object)."""
import sys

from mindspeed_rl.compat import pad_process as _home

sys.modules[__name__] = _home
