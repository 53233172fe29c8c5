"""The keys: typed config classes (upstream's names), their defaults and the checks of one key each. The run
plan built from them (layout, stage table, cross-key checks, YAML loading) is mindspeed_rl.plan.

Names load on first use, so ``python -m mindspeed_rl.config_cls.unimplemented``
runs that module fresh."""
from mindspeed_rl._lazy import lazy_exports

_EXPORTS = {
    "BaseConfig": "mindspeed_rl.config_cls.base_config",
    "GenerateConfig": "mindspeed_rl.config_cls.generate_config",
    "MegatronConfig": "mindspeed_rl.config_cls.megatron_config",
    "RLConfig": "mindspeed_rl.config_cls.rl_config",
    "validate_rl_args": "mindspeed_rl.config_cls.validate_config",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
