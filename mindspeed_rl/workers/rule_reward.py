"""Upstream's path of the worker-side RuleReward (mindspeed_rl.compat.rule_reward)."""
from mindspeed_rl.compat.rule_reward import RuleReward  # noqa: F401
