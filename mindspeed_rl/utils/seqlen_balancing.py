"""Upstream's path of the balancer. The module lives in mindspeed_rl.balance.seqlen_balancing; this name is the
same module object, so ported code that imports or patches it here reaches the one definition."""
import sys

from mindspeed_rl.balance import seqlen_balancing as _home

sys.modules[__name__] = _home
