"""One type check for every key of every section, before any value is compared: errors name
``section.key``, the expected type and the value."""
import os
import sys

import pytest
import ray

from mindspeed_rl.config_cls import key_types
from mindspeed_rl.config_cls.generate_config import SAMPLING_DEFAULTS, GenerateConfig
from mindspeed_rl.plan.loader import build_configs, load_config
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.config_cls.rl_config import RLConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TINY = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")


def test_every_unset_key_has_a_type():
    for cls in (MegatronConfig, RLConfig, GenerateConfig):
        unset = [k for k, v in cls()._declared_defaults().items() if v is None]
        assert unset and [k for k in unset if key_types.unset_types(cls.__name__, k) is None] == [], cls
    assert key_types.unset_types("GenerateConfig", "sampling_config.seed") == (int,)
    assert [k for k, v in SAMPLING_DEFAULTS.items() if v is None] == ["seed"]


@pytest.mark.parametrize("override, message", [
    # the drill's case: a comparison with the batch size raised "'>' not supported ..."
    ("megatron_training.global_batch_size=eight", "megatron_training.global_batch_size expects int, got 'eight' (str)"),
    ("actor_config.train_iters=4.5", "actor_config.train_iters expects int, got 4.5 (float)"),
    ("megatron_training.seq_length=[1]", "megatron_training.seq_length expects int, got [1] (list)"),
    ("megatron_training.lr=fast", "megatron_training.lr expects float (or int), got 'fast' (str)"),
    ("megatron_training.noop_layers=1.5", "megatron_training.noop_layers expects str, int or list, got 1.5 (float)"),
    ("rl_config.stage_timeout=soon", "rl_config.stage_timeout expects float (or int), got 'soon' (str)"),
    ("rl_config.n_samples_per_prompt=two", "rl_config.n_samples_per_prompt expects int, got 'two' (str)"),
    ("generate_config.data_parallel_size=true", "generate_config.data_parallel_size expects int, got True (bool)"),
    ("generate_config.sampling_config.seed=abc", "generate_config.sampling_config.seed expects int, got 'abc' (str)"),
    ("model.tiny_qwen2.hidden_size=wide", "model.tiny_qwen2.hidden_size expects int, got 'wide' (str)"),
    ("critic_config.seq_length=long", "critic_config.seq_length expects int, got 'long' (str)"),
    ("rl_config.critic_resource=[2]", "rl_config.critic_resource expects dict, got [2] (list)"),
])
def test_wrong_type_names_section_key_type_and_value(override, message):
    cfg = load_config(TINY, [override])
    with pytest.raises(TypeError) as info:
        build_configs(cfg)
    assert str(info.value) == message


def test_wrong_type_in_yaml_is_named_the_same_way(tmp_path):
    text = open(TINY, encoding="utf-8").read().replace("global_batch_size: 8", "global_batch_size: eight")
    assert "global_batch_size: eight" in text
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TypeError, match=r"^megatron_training\.global_batch_size expects int, got 'eight'"):
        build_configs(load_config(str(path)))


def test_values_of_the_listed_types_are_accepted():
    cfgs = build_configs(load_config(TINY, [
        "megatron_training.split=100,0,0", "megatron_training.save_interval=null", "rl_config.stage_timeout=30",
        "generate_config.sampling_config.seed=7", "megatron_training.lora_target_modules=[linear_qkv]"]))
    assert cfgs.actor_config.split == "100,0,0" and cfgs.rl_config.stage_timeout == 30.0
    assert cfgs.generate_config.sampling_config["seed"] == 7


def test_cli_prints_one_line_before_ray(capsys):
    sys.path.insert(0, ROOT)
    from cli.train_grpo import main
    assert main(["--config", TINY, "megatron_training.global_batch_size=eight"]) == 2
    err = capsys.readouterr().err
    assert err == "error: megatron_training.global_batch_size expects int, got 'eight' (str)\n"
    assert not ray.is_initialized()
