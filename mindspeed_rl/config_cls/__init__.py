"""Configuration layer: typed config classes, YAML loading and validation.

Names load on first use, so ``python -m mindspeed_rl.config_cls.unimplemented``
runs that module fresh."""
from mindspeed_rl._lazy import lazy_exports

_EXPORTS = {
    "BaseConfig": "mindspeed_rl.config_cls.base_config",
    "GenerateConfig": "mindspeed_rl.config_cls.generate_config",
    "ConfigError": "mindspeed_rl.config_cls.loader",
    "RunConfigs": "mindspeed_rl.config_cls.loader",
    "build_configs": "mindspeed_rl.config_cls.loader",
    "load_config": "mindspeed_rl.config_cls.loader",
    "MegatronConfig": "mindspeed_rl.config_cls.megatron_config",
    "RLConfig": "mindspeed_rl.config_cls.rl_config",
    "validate_rl_args": "mindspeed_rl.config_cls.validate_config",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
