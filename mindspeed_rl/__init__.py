"""mindspeed-rl: GRPO, DAPO and PPO post-training with DP batch balance (data-parallel sequence-length balance)."""
import os

from mindspeed_rl._lazy import lazy_exports

# Local Ray clusters stay on this machine (must be set before ray is imported).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

__version__ = "0.1.0"

# upstream's top-level names that exist here (docs/upstream_api.md lists the rest)
_EXPORTS = {
    "MegatronConfig": "mindspeed_rl.config_cls.megatron_config",
    "GenerateConfig": "mindspeed_rl.config_cls.generate_config",
    "RLConfig": "mindspeed_rl.config_cls.rl_config",
    "RayGRPOTrainer": "mindspeed_rl.trainer.grpo_trainer_hybrid",
    "RayActorGroup": "mindspeed_rl.workers.scheduler.launcher",
    "RuleReward": "mindspeed_rl.workers.rule_reward",
    "get_tokenizer": "mindspeed_rl.utils.tokenizer",
    "Metric": "mindspeed_rl.utils.metrics",
    "get_batch_metrices_mean": "mindspeed_rl.utils.utils",
    "num_floating_point_operations": "mindspeed_rl.utils.utils",
    "seed_all": "mindspeed_rl.utils.utils",
    "synchronize_time": "mindspeed_rl.utils.utils",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
