"""Upstream's module path of the driver-side computations: our reward stage (trainer/utils/reward_stage.py),
the KL controllers (algorithms/kl.py) and the dock's column write; upstream's stages over a dock
(mindspeed_rl.compat.compute_utils) are imported on first use."""
from mindspeed_rl._lazy import lazy_exports
from mindspeed_rl.algorithms.kl import AdaptiveKLController, FixedKLController  # noqa: F401
from mindspeed_rl.data.driver_dock import put_columns  # noqa: F401
from mindspeed_rl.trainer.utils.reward_stage import (advantage_stats, compute_rewards, data_metrics,  # noqa: F401
                                                     overlong_penalty, reward_stats, score_rows, verifier_scores)

_COMPAT = "mindspeed_rl.compat.compute_utils"
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(
    ("compute_advantage", "compute_grpo_data_metrics", "compute_rule_reward", "dock_call", "get_last_reward"),
    _COMPAT))
