"""Tests of the configuration layer: classes, YAML loading, validation."""
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from mindspeed_rl.config_cls import GenerateConfig, MegatronConfig, RLConfig, validate_rl_args
from mindspeed_rl.plan import ConfigError, build_configs, load_config

REPO = Path(__file__).resolve().parents[3]
TEST_YAML = REPO / "tests/st/configs/test_grpo_trainer_qwen25_7b_integrated.yaml"
A3_YAML = REPO / "configs/grpo_qwen25_7b_A3.yaml"
TINY_YAML = REPO / "configs/grpo_tiny_cpu.yaml"


# ---------------------------------------------------------------- shipped files

@pytest.mark.parametrize("path", [TEST_YAML, A3_YAML, TINY_YAML], ids=lambda p: p.name)
def test_shipped_yaml_builds(path):
    run = build_configs(load_config(path))
    assert run.rl_config.use_dp_batch_balance is True
    assert run.actor_config.num_layers is not None
    assert run.ref_config is run.actor_config  # integrated mode shares the config


def test_integrated_test_yaml_values():
    cfg = load_config(TEST_YAML)
    assert cfg["model"]["qwen25_7b"]["num_layers"] == 28
    run = build_configs(cfg)
    rl, actor, gen = run.rl_config, run.actor_config, run.generate_config
    assert rl.use_dp_batch_balance is True
    assert rl.n_samples_per_prompt == 8
    # upstream's mini_batch_size: 64 prompts > global_batch_size 4: one mini-batch is the whole batch
    assert cfg["rl_config"]["mini_batch_size"] == 64
    assert rl.mini_batch_size == 4 * 8 == run.plan.mini_batch_rows  # stored in samples
    assert rl.actor_resource["num_npus"] == 8
    assert rl.reference_resource is rl.actor_resource
    assert rl.max_packing_token_size == 8192 and rl.use_dynamic_bsz is True
    # model section merged under the training keys
    assert actor.hidden_size == 3584 and actor.num_query_groups == 4
    assert actor.rotary_base == 1000000
    assert actor.tensor_model_parallel_size == 4
    assert actor.lr == pytest.approx(5e-7) and isinstance(actor.lr, float)
    assert actor.min_lr == pytest.approx(5e-8)
    assert actor.initial_loss_scale == 4096.0
    assert actor.split == "100,0,0"
    assert actor.dataset_additional_keys == ["labels"]
    assert actor.max_prompt_length == 1024
    assert gen.sampling_config["top_p"] == 0.9
    assert gen.sampling_config["seed"] is None  # default kept by the merge
    assert gen.data_parallel_size == 2  # rollout runs on the actor's layout: 8 devices / TP 4
    assert rl.ref_dispatch_size == 16  # 32 samples / DP 2, copied from the run plan
    assert run.plan.stages["ref_log_prob"].rows_per_share == 16
    assert not run.plan.computes_old_log_prob  # one mini-batch, one epoch: on-policy
    assert run.extra["profiler_config"]["integrated"]["profile_ranks"] == [0, 1]
    assert run.extra["msprobe_config"]["dump_path"] == "./msprobe_dump"


def test_tiny_cpu_yaml_values():
    run = build_configs(load_config(TINY_YAML))
    actor, rl, gen = run.actor_config, run.rl_config, run.generate_config
    assert (actor.vocab_size, actor.padded_vocab_size) == (32, 32)
    assert (actor.hidden_size, actor.num_layers, actor.ffn_hidden_size) == (64, 2, 128)
    assert (actor.num_attention_heads, actor.num_query_groups) == (4, 2)
    assert actor.bf16 is False and actor.lr == pytest.approx(1e-3)
    assert actor.global_batch_size == 8 and actor.seq_length == 32 and actor.train_iters == 4
    assert rl.mini_batch_size == 16 and rl.n_samples_per_prompt == 4
    assert rl.use_remove_padding and rl.use_dynamic_bsz and rl.max_packing_token_size == 256
    assert rl.actor_resource["num_npus"] == 2
    assert gen.sampling_config["max_tokens"] == 10
    assert gen.sampling_config["temperature"] == 1.0


# ---------------------------------------------------------------- defaults

def test_rl_defaults():
    rl = RLConfig({})
    assert rl.use_dp_batch_balance is False
    assert rl.dp_balance_objective == "tokens"
    assert rl.dp_balance_method == "auto"
    assert rl.td_timeout == 600.0
    assert rl.seed == 1234
    assert rl.kl_penalty == "low_var_kl" and rl.entropy_coeff == 0.0
    assert rl.actor_resource == {"num_npus": None}
    assert rl.max_packing_token_size == 4096 and rl.use_integrated_worker is True
    assert rl.mini_batch_size == 1


def test_megatron_and_generate_defaults():
    cfg = MegatronConfig({}, {})
    assert cfg.tensor_model_parallel_size == 1
    assert cfg.pipeline_model_parallel_size == 1
    assert cfg.context_parallel_size == 1
    assert cfg.model_path is None and cfg.tokenizer_name_or_path is None
    gen = GenerateConfig({})
    assert gen.sampling_config["max_tokens"] == 128
    assert gen.sampling_config["temperature"] == 0.2
    assert gen.infer_tensor_parallel_size == 8


def test_mini_batch_multiplied_and_dashes():
    rl = RLConfig({"mini-batch-size": 3, "n_samples_per_prompt": 5})
    assert rl.mini_batch_size == 15


def test_model_section_merged_first():
    models = {"m": {"num_layers": 3, "hidden_size": 8}}
    cfg = MegatronConfig({"model": "m", "hidden_size": 16}, models)
    assert cfg.num_layers == 3 and cfg.hidden_size == 16


def test_unknown_model_name():
    with pytest.raises(ValueError, match="nope"):
        MegatronConfig({"model": "nope"}, {"m": {}})


def test_dict_items_repr():
    rl = RLConfig({"seed": 7})
    assert rl.dict()["seed"] == 7 and ("seed", 7) in rl.items()
    assert "_defaults" not in rl.dict()
    assert repr(rl).startswith("<RLConfig ") and "'seed': 7" in repr(rl)


# ---------------------------------------------------------------- strictness

@pytest.mark.parametrize("cls,args", [
    (RLConfig, lambda d: (d,)),
    (GenerateConfig, lambda d: (d,)),
    (MegatronConfig, lambda d: (d, {})),
])
def test_unknown_key_names_key_and_class(cls, args):
    with pytest.raises(ValueError, match=rf"{cls.__name__}.*'no_such_key'"):
        cls(*args({"no_such_key": 1}))


def test_unknown_nested_keys():
    with pytest.raises(ValueError, match="sampling_config.beam"):
        GenerateConfig({"sampling_config": {"beam": 2}})
    with pytest.raises(ValueError, match="actor_resource.num_tpus"):
        RLConfig({"actor_resource": {"num_tpus": 2}})


@pytest.mark.parametrize("key,value,expected", [
    ("use_dp_batch_balance", 1, "bool"),         # int is not a bool
    ("n_samples_per_prompt", True, "int"),       # bool is not an int
    ("n_samples_per_prompt", 2.0, "int"),
    ("td_timeout", "60", "float"),
    ("dp_balance_method", 3, "str"),
    ("verifier_function", "base_acc", "list"),
    ("actor_resource", [2], "dict"),
])
def test_wrong_type_names_key(key, value, expected):
    with pytest.raises(TypeError, match=rf"^rl_config\.{key} expects {expected}.*{value!r}"):
        RLConfig({key: value})


def test_type_rules_that_accept():
    rl = RLConfig({"td_timeout": 30, "integrated_mode_config": {"x": 1}})
    assert rl.td_timeout == 30.0 and isinstance(rl.td_timeout, float)
    assert rl.integrated_mode_config == {"x": 1}  # None default takes anything
    with pytest.raises(TypeError, match="sampling_config.max_tokens"):
        GenerateConfig({"sampling_config": {"max_tokens": "ten"}})


def test_type_of_key_fixed_by_default_not_current_value():
    rl = RLConfig({"actor_forward_micro_batch_size": 4})
    rl.update({"actor_forward_micro_batch_size": None})  # an unset key may be unset again
    assert rl.actor_forward_micro_batch_size is None
    # a None default takes its key_types entry: the type is fixed before any value is compared
    with pytest.raises(TypeError, match=r"^rl_config\.actor_forward_micro_batch_size expects int, got 'auto' \(str\)"):
        rl.update({"actor_forward_micro_batch_size": "auto"})


def test_custom_resources_of_a_worker_group_are_checked_and_kept():
    rl = RLConfig({"actor_resource": {"num_npus": 2, "custom_resources": {"node_a": 1}},
                   "critic_resource": {"num_npus": 1, "custom_resources": {"node_b": 0.5}}})
    assert rl.actor_resource == {"num_npus": 2, "custom_resources": {"node_a": 1.0}}
    assert rl.critic_resource["custom_resources"] == {"node_b": 0.5}
    assert RLConfig({"actor_resource": {"num_npus": 2}}).actor_resource == {"num_npus": 2}
    for given, error, match in [
            ({"CPU": 1}, ValueError, r"rl_config.actor_resource.custom_resources: 'CPU' is not a custom resource"),
            ({"node_a": 0}, ValueError, r"custom_resources.node_a must be a number > 0 .*got 0$"),
            ({"node_a": True}, ValueError, r"custom_resources.node_a must be a number > 0"),
            ({}, TypeError, r"actor_resource.custom_resources expects a non-empty dict"),
            (["node_a"], TypeError, r"actor_resource.custom_resources expects a non-empty dict")]:
        with pytest.raises(error, match=match):
            RLConfig({"actor_resource": {"num_npus": 2, "custom_resources": given}})


def test_resource_aliases():
    assert RLConfig({"actor_resource": {"num_gpus": 2}}).actor_resource["num_npus"] == 2
    assert RLConfig({"actor_resource": {"num_cpus": 3}}).actor_resource["num_npus"] == 3
    with pytest.raises(ValueError, match="actor_resource"):
        RLConfig({"actor_resource": {"num_npus": 2, "num_gpus": 4}})
    with pytest.raises(TypeError, match="actor_resource.num_npus"):
        RLConfig({"actor_resource": {"num_npus": "two"}})


@given(st.integers(min_value=1, max_value=64), st.integers(min_value=1, max_value=16))
def test_mini_batch_is_prompts_times_samples(mini, n):
    rl = RLConfig({"mini_batch_size": mini, "n_samples_per_prompt": n})
    assert rl.mini_batch_size == mini * n


# ---------------------------------------------------------------- validation

def _configs(rl=None, actor=None, gen=None):
    """A small valid setup: 2 devices, DP 2, 8 prompts x 4 samples."""
    actor_cfg = MegatronConfig({"global_batch_size": 8, "seq_length": 32, "train_iters": 2,
                                "micro_batch_size": 2, **(actor or {})}, {})
    rl_cfg = RLConfig({"n_samples_per_prompt": 4, "mini_batch_size": 4,
                       "max_prompt_length": 8, "actor_resource": {"num_npus": 2},
                       **(rl or {})})
    gen_cfg = GenerateConfig({"infer_tensor_parallel_size": 1, **(gen or {})})
    return actor_cfg, actor_cfg, actor_cfg, rl_cfg, gen_cfg


def test_validate_accepts_baseline_and_fills_derived():
    args = _configs()
    plan = validate_rl_args(*args)
    rl, gen = args[3], args[4]
    assert rl.reference_resource == {"num_npus": 2}
    assert gen.data_parallel_size == 2 == plan.layout.dp
    assert rl.actor_logprob_dispatch_size == 16 and rl.adv_dispatch_size == 32
    assert plan.stages["actor_log_prob"].rows_per_share == 16


@pytest.mark.parametrize("rl,actor,gen,field", [
    ({"use_dynamic_bsz": True, "max_packing_token_size": 0}, {}, {}, "max_packing_token_size"),
    ({"dp_balance_objective": "time"}, {}, {}, "dp_balance_objective"),
    ({"dp_balance_method": "random"}, {}, {}, "dp_balance_method"),
    ({"n_samples_per_prompt": 0}, {}, {}, "n_samples_per_prompt"),
    ({"td_timeout": 0.0}, {}, {}, "td_timeout"),
    ({"max_prompt_length": 0}, {}, {}, "max_prompt_length"),
    ({"max_prompt_length": 64}, {}, {}, "max_prompt_length"),       # > seq_length
    ({"mini_batch_size": 3}, {}, {}, "mini_batch_size"),            # 12 does not divide 32
    ({"mini_batch_size": 1, "n_samples_per_prompt": 1, "actor_resource": {"num_npus": 2}},
     {"global_batch_size": 3}, {}, "mini_batch_size"),              # 1 sample over 2 ranks
    ({"mini_batch_size": 2}, {"micro_batch_size": 8}, {}, "micro_batch_size"),
    ({"reference_resource": {"num_npus": 2}}, {}, {}, "reference_resource"),
    ({"reward_resource": {"num_npus": 2}}, {}, {}, "reward_resource"),
    ({"actor_resource": {"num_npus": 3}}, {"tensor_model_parallel_size": 2}, {}, "tensor_model_parallel_size"),
    ({"actor_resource": {"num_npus": None}}, {}, {}, "num_npus"),
    ({}, {"pipeline_model_parallel_size": 3}, {}, "pipeline"),     # 2 devices / (TP 1 x PP 3)
    ({}, {"context_parallel_size": 0}, {}, "context_parallel_size"),
    ({}, {"expert_model_parallel_size": 4}, {}, "expert_model_parallel_size"),
    ({}, {}, {"infer_pipeline_parallel_size": 2}, "infer_pipeline_parallel_size"),
    ({}, {}, {"data_parallel_size": 4}, "data_parallel_size"),
    ({}, {}, {"max_model_len": 16}, "max_model_len"),
    ({"verifier_weight": [1.0, 2.0]}, {}, {}, "verifier_weight"),
    ({"actor_logprob_dispatch_size": 5}, {}, {}, "actor_logprob_dispatch_size"),
    ({"actor_logprob_dispatch_size": 32}, {}, {}, "actor_logprob_dispatch_size"),  # 1 share for 2 ranks
    ({"actor_update_dispatch_size": 0}, {}, {}, "actor_update_dispatch_size"),
    ({}, {"global_batch_size": None}, {}, "global_batch_size"),
    ({}, {"train_iters": 0}, {}, "train_iters"),
    ({"epochs": 0}, {}, {}, "epochs"),
])
def test_validate_rule_names_field(rl, actor, gen, field):
    with pytest.raises(ValueError, match=field):
        validate_rl_args(*_configs(rl, actor, gen))


def test_shares_need_not_be_whole_groups():
    """Sample-level balance: a rank's share of a mini-batch may split GRPO groups
    (advantages are in the dock before any DP stage runs)."""
    plan = validate_rl_args(*_configs({"mini_batch_size": 1, "n_samples_per_prompt": 2}, {"micro_batch_size": 1}))
    assert plan.stages["actor_train"].rows_per_share == 1
    plan = validate_rl_args(*_configs({"ref_dispatch_size": 2}))
    assert plan.stages["ref_log_prob"].shares_per_rank == 8


def test_packing_budget_below_the_longest_sequence_warns():
    # as upstream: only a sequence that really exceeds the budget stops the run
    with pytest.warns(UserWarning, match=r"max_packing_token_size=12 is below the longest possible sequence"):
        validate_rl_args(*_configs({"use_dynamic_bsz": True, "max_packing_token_size": 12}))


def test_validate_mini_batch_not_multiple_of_n():
    args = _configs()
    args[3].mini_batch_size = 6  # set directly, bypassing the multiplication
    with pytest.raises(ValueError, match="n_samples_per_prompt"):
        validate_rl_args(*args)


def test_validate_does_not_demand_bf16():
    validate_rl_args(*_configs(actor={"bf16": False}))


# ---------------------------------------------------------------- loader

def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_config(tmp_path / "missing.yaml")


def test_bad_yaml_names_file(tmp_path):
    bad = _write(tmp_path / "bad.yaml", "rl_config: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_config(bad)


def test_missing_model_file_names_model_and_paths(tmp_path):
    cfg = _write(tmp_path / "c.yaml", "defaults:\n  - model: [ghost_model]\nrl_config: {}\n")
    with pytest.raises(FileNotFoundError) as err:
        load_config(cfg)
    msg = str(err.value)
    assert "ghost_model" in msg
    assert str(tmp_path / "model" / "ghost_model.yaml") in msg
    assert str(REPO / "configs" / "model" / "ghost_model.yaml") in msg


def test_non_mapping_section(tmp_path):
    cfg = _write(tmp_path / "c.yaml", "rl_config: [1, 2]\n")
    with pytest.raises(ConfigError, match="rl_config"):
        load_config(cfg)


def test_non_mapping_top_level(tmp_path):
    with pytest.raises(ConfigError, match="top level"):
        load_config(_write(tmp_path / "c.yaml", "- a\n- b\n"))


def test_model_search_order_and_string_form(tmp_path):
    # a model file next to the config shadows the repository's one
    _write(tmp_path / "model" / "tiny_qwen2.yaml", "tiny_qwen2:\n  num_layers: 5\n")
    cfg = _write(tmp_path / "c.yaml", "defaults:\n  - model: tiny_qwen2\n")
    assert load_config(cfg)["model"] == {"tiny_qwen2": {"num_layers": 5}}
    # ../model is searched next
    other = _write(tmp_path / "sub" / "c.yaml", "defaults:\n  - model: tiny_qwen2\n")
    assert load_config(other)["model"]["tiny_qwen2"]["num_layers"] == 5
    # falls back to the repository
    lone = _write(tmp_path / "a" / "b" / "c.yaml", "defaults:\n  - model: tiny_qwen2\n")
    assert load_config(lone)["model"]["tiny_qwen2"]["num_layers"] == 2


def test_overrides():
    cfg = load_config(TINY_YAML, overrides=[
        "rl_config.n_samples_per_prompt=2",
        "rl_config.dp_balance_method=karmarkar_karp",
        "actor_config.lr=1e-4",
        "generate_config.sampling_config.max_tokens=5",
        "model.tiny_qwen2.num_layers=3",
        "rl_config.actor_resource={num_npus: 1}",
    ])
    run = build_configs(cfg)
    assert run.rl_config.n_samples_per_prompt == 2
    assert run.rl_config.mini_batch_size == 8
    assert run.rl_config.dp_balance_method == "karmarkar_karp"
    assert run.actor_config.lr == pytest.approx(1e-4)
    assert run.generate_config.sampling_config["max_tokens"] == 5
    assert run.generate_config.sampling_config["temperature"] == 1.0
    assert run.actor_config.num_layers == 3 and run.actor_config.hidden_size == 64
    assert run.rl_config.actor_resource["num_npus"] == 1


@pytest.mark.parametrize("bad", ["rl_config", "seed=1", "rl_config.=1", "rl_config.seed.x=1"])
def test_bad_override(bad):
    with pytest.raises(ConfigError):
        load_config(TINY_YAML, overrides=[bad])


def test_override_invalid_value_rejected_by_validation():
    cfg = load_config(TINY_YAML, overrides=["rl_config.dp_balance_objective=latency"])
    with pytest.raises(ValueError, match="dp_balance_objective"):
        build_configs(cfg)


def test_ref_section_rejected_in_integrated_mode(tmp_path):
    text = TINY_YAML.read_text() + "\nref_config:\n  micro_batch_size: 1\n"
    cfg = _write(tmp_path / "c.yaml", text)
    with pytest.raises(ConfigError, match="ref_config"):
        build_configs(load_config(cfg))


def test_custom_resources_reach_each_groups_layout_in_the_plan():
    from mindspeed_rl.plan import build_configs, load_config
    ppo = build_configs(load_config("configs/ppo_tiny_cpu.yaml", [
        "megatron_training.model_path=/unused", "rl_config.actor_resource.custom_resources={node_a: 1}",
        "rl_config.critic_resource.custom_resources={node_b: 0.5, gpu_pool: 2}"])).plan
    assert ppo.layout.resources == (("node_a", 1.0),)
    assert ppo.for_group("critic").layout.resources == (("gpu_pool", 2.0), ("node_b", 0.5))
    plain = build_configs(load_config("configs/grpo_tiny_cpu.yaml", ["megatron_training.model_path=/unused"])).plan
    assert plain.layout.resources == ()
