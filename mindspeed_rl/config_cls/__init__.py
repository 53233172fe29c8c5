"""Configuration layer: typed config classes, YAML loading and validation."""
from mindspeed_rl.config_cls.base_config import BaseConfig
from mindspeed_rl.config_cls.generate_config import GenerateConfig
from mindspeed_rl.config_cls.loader import ConfigError, RunConfigs, build_configs, load_config
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.config_cls.validate_config import validate_rl_args

__all__ = [
    "BaseConfig", "ConfigError", "GenerateConfig", "MegatronConfig", "RLConfig",
    "RunConfigs", "build_configs", "load_config", "validate_rl_args",
]
