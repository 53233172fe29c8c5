"""Upstream's path of the worker-side RuleReward (mindspeed_rl.compat.rule_reward, imported on first use)."""
from mindspeed_rl._lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {"RuleReward": "mindspeed_rl.compat.rule_reward"})
