"""What build_configs fills in and how it names what it refuses: the weights folder taken from upstream's
tokenizer_name_or_path only when model_path is unset (the actor's and the critic's), a missing batch size,
dashed keys and mapping values named under their own section, num_layer_list and noop_layers."""
import warnings
from pathlib import Path

import pytest

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.loader import ConfigError, parse_yaml

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"
PPO = TINY.parent / "ppo_tiny_cpu.yaml"


def _configs(*overrides, path=TINY):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_configs(load_config(path, list(overrides)))


def _actor(*overrides):
    return _configs(*overrides).actor_config


def test_the_tokenizer_folder_is_the_weights_only_when_model_path_is_unset():
    # upstream gives only the HF folder the weights were converted from: it is the weights
    actor = _actor("megatron_training.tokenizer_name_or_path=/hf/tok")
    assert actor.model_path == "/hf/tok" and actor.tokenizer_name_or_path == "/hf/tok"
    # a model_path of its own is kept, the tokenizer folder stays the tokenizer
    actor = _actor("megatron_training.tokenizer_name_or_path=/hf/tok", "megatron_training.model_path=/hf/weights")
    assert actor.model_path == "/hf/weights" and actor.tokenizer_name_or_path == "/hf/tok"
    # neither: no weights are made up
    actor = _actor()
    assert actor.model_path is None and actor.tokenizer_name_or_path is None


def test_a_missing_batch_size_is_named_by_its_key():
    with pytest.raises(ValueError) as info:
        _actor("megatron_training.global_batch_size=null")
    assert str(info.value) == "megatron_training.global_batch_size must be a positive int, got None"


def test_a_critic_without_weights_of_its_own_starts_from_the_actors():
    # only upstream's tokenizer folder is given: the actor's weights come from it, and so do the critic's
    cfgs = _configs("megatron_training.tokenizer_name_or_path=/hf/tok", path=PPO)
    assert cfgs.actor_config.model_path == cfgs.critic_config.model_path == "/hf/tok"
    # a critic model_path that only repeats its tokenizer folder is not weights of its own
    cfgs = _configs("megatron_training.model_path=/hf/actor", "critic_config.model_path=/hf/tok",
                    "critic_config.tokenizer_name_or_path=/hf/tok", path=PPO)
    assert cfgs.critic_config.model_path == "/hf/actor"


def _type_error(*overrides):
    with pytest.raises(TypeError) as info:
        _configs(*overrides)
    return str(info.value)


def test_dashed_keys_are_type_checked_under_their_own_section():
    # the role section and the model are named, not the merged megatron_training they end up in
    assert _type_error("actor_config.train-iters=4.5") == "actor_config.train_iters expects int, got 4.5 (float)"
    assert _type_error("model.tiny_qwen2.hidden-size=wide") == \
        "model.tiny_qwen2.hidden_size expects int, got 'wide' (str)"


def test_a_mapping_for_a_plain_key_is_named_under_its_section():
    assert _type_error("actor_config.seq_length={a: 1}") == "actor_config.seq_length expects int, got {'a': 1} (dict)"


def test_num_layer_list_sizes_must_add_up_to_the_layers():
    # one size per stage, but 1 + 2 layers for a 2-layer model
    with pytest.raises(ValueError) as info:
        _configs("actor_config.pipeline_model_parallel_size=2", "actor_config.num_layer_list='1,2'")
    assert str(info.value) == ("megatron_training.num_layer_list='1,2' must give pipeline_model_parallel_size=2 "
                               "stage sizes adding up to num_layers=2")


def test_noop_layers_that_are_not_integers_are_named():
    with pytest.raises(ValueError) as info:
        _configs("model.tiny_qwen2.num_layers=4", "megatron_training.noop_layers='1,x'")
    assert str(info.value) == "megatron_training.noop_layers='1,x' must be comma-separated integers"


def test_refusals_of_the_key_table_and_of_the_model_family_are_config_errors():
    # raised as ConfigError (the CLI's one-line error), not the checks' default ValueError
    with pytest.raises(ConfigError) as info:
        _configs("rl_config.use_integrated_worker=false")
    assert str(info.value).startswith("rl_config.use_integrated_worker=False is not implemented: ")
    with pytest.raises(ConfigError) as info:
        _configs("model.tiny_qwen2.swiglu=false")
    assert str(info.value).startswith("model key swiglu=False is not supported: the model section describes a ")


def test_a_config_that_cannot_learn_says_why_in_a_warning():
    cfg = load_config(TINY, ["rl_config.n_samples_per_prompt=1", "rl_config.mini_batch_size=8"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_configs(cfg)
    notes = [w for w in caught if "can be learned" in str(w.message)]
    assert len(notes) == 1 and notes[0].category is UserWarning
    # one group holds one sample: group-normalised advantages are all 0
    assert str(notes[0].message).startswith(
        "nothing can be learned: rl_config.n_samples_per_prompt=1 with adv_estimator group_norm: ")


def test_an_unknown_generate_config_key_is_named_with_the_closest():
    with pytest.raises(ConfigError) as info:
        _configs("generate_config.max_num_seq=1")
    assert str(info.value) == "generate_config: unknown key 'max_num_seq'; did you mean 'max_num_seqs'?"


def test_a_model_section_cannot_name_a_model():
    # `model:` picks the model in a role section; inside a model's own settings it is no key
    with pytest.raises(ConfigError) as info:
        _configs("model.tiny_qwen2.model=tiny_qwen2")
    assert str(info.value) == "model tiny_qwen2: unknown key 'model'; did you mean 'model_path'?"


def test_yaml_text_without_a_source_is_named_as_a_string():
    assert parse_yaml("a: [1, 2]") == {"a": [1, 2]}
    with pytest.raises(ConfigError) as info:
        parse_yaml("a: [")
    assert str(info.value).startswith("invalid YAML in <string>: ")
