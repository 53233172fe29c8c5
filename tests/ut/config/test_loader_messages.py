"""load_config and build_configs: the whole message of each refusal (the file, section, key or override it
names), overrides and model files as they land in the sections, and what build_configs rewrites (upstream's
meanings, the weights a load names, the critic's folders)."""
import os
import warnings
from pathlib import Path

import pytest

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.loader import KNOWN_SECTIONS, REPO_MODEL_DIR, ConfigError
# imported here, not first inside a build: the mutation run's forked test processes then share the import
from mindspeed_rl.rewards.rule_reward import verifier_names

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "configs" / "grpo_tiny_cpu.yaml"
PPO = ROOT / "configs" / "ppo_tiny_cpu.yaml"
KNOWN = ", ".join(KNOWN_SECTIONS + ("profiler_config", "msprobe_config"))


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _message(call, *args, error=ConfigError, **kwargs):
    with pytest.raises(error) as info:
        call(*args, **kwargs)
    return str(info.value)


def _build(*overrides, path=TINY):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfgs = build_configs(load_config(path, list(overrides)))
    return cfgs, [str(w.message) for w in caught]


# ------------------------------------------------------------------ the file and its sections


def test_a_missing_file_is_named(tmp_path):
    path = tmp_path / "none.yaml"
    assert _message(load_config, path, error=FileNotFoundError) == f"config file not found: {path}"


def test_bad_yaml_names_the_file_and_the_parser_error(tmp_path):
    path = _write(tmp_path / "c.yaml", "rl_config: [unclosed\n")
    text = _message(load_config, path)
    assert text.startswith(f"invalid YAML in {path}: ") and "flow sequence" in text


def test_top_level_and_sections_must_be_mappings(tmp_path):
    path = _write(tmp_path / "c.yaml", "- a\n")
    assert _message(load_config, path) == f"top level of {path} must be a mapping of sections"
    path = _write(tmp_path / "d.yaml", "rl_config: [1, 2]\n")
    assert _message(load_config, path) == f"section 'rl_config' in {path} must be a mapping, got list"
    path = _write(tmp_path / "e.yaml", "model: [1]\n")
    assert _message(load_config, path) == f"section 'model' in {path} must be a mapping, got list"


def test_an_empty_section_is_an_empty_mapping_and_defaults_is_no_section(tmp_path):
    path = _write(tmp_path / "c.yaml", "defaults:\nrl_config:\ngenerate_config: {}\n")
    assert load_config(path) == {"rl_config": {}, "generate_config": {}, "model": {}}


def test_an_unknown_section_lists_the_known_ones(tmp_path):
    path = _write(tmp_path / "c.yaml", "rl_confg: {}\n")
    assert _message(load_config, path) == \
        f"unknown section 'rl_confg' in {path} (did you mean 'rl_config'?); known sections: {KNOWN}"
    # a prefix of a known section is the hint before any close spelling
    path = _write(tmp_path / "d.yaml", "actor: {}\n")
    assert _message(load_config, path) == \
        f"unknown section 'actor' in {path} (did you mean 'actor_config'?); known sections: {KNOWN}"
    path = _write(tmp_path / "e.yaml", "zzz: {}\n")
    assert _message(load_config, path) == f"unknown section 'zzz' in {path}; known sections: {KNOWN}"


def test_ignored_sections_load_warn_when_set_and_stay_in_extra(tmp_path):
    path = _write(tmp_path / "c.yaml", TINY.read_text() + "msprobe_config: {}\n")
    cfgs, notes = _build("profiler_config.profile=true", path=path)
    assert cfgs.extra == {"profiler_config": {"profile": True}, "msprobe_config": {}}
    assert "section 'profiler_config' is not implemented: no profiling is done" in notes
    assert not any("msprobe_config" in n for n in notes)  # empty: nothing to say


# ------------------------------------------------------------------ overrides


@pytest.mark.parametrize("item, message", [
    ("rl_config", "override 'rl_config' must look like 'section.key=value'"),
    (5, "override 5 must look like 'section.key=value'"),
    ("seed=1", "override 'seed=1' must name a section and a key: 'section.key=value'"),
    ("rl_config.=1", "override 'rl_config.=1' must name a section and a key: 'section.key=value'"),
    (".seed=1", "override '.seed=1' must name a section and a key: 'section.key=value'"),
    ("rl_config.seed.x=1", "override 'rl_config.seed.x=1': 'seed' is not a mapping"),
])
def test_bad_overrides_are_named(item, message):
    assert _message(load_config, TINY, [item]) == message


def test_override_paths_are_stripped_and_values_parsed_as_yaml(tmp_path):
    path = _write(tmp_path / "c.yaml", "rl_config: {}\n")
    cfg = load_config(path, [" rl_config . seed = 7", "rl_config.note=a=b", "generate_config.sampling_config.top_k=5",
                             "rl_config.lr=5e-7"])
    assert cfg["rl_config"] == {"seed": 7, "note": "a=b", "lr": 5e-7}
    assert cfg["generate_config"] == {"sampling_config": {"top_k": 5}}  # sections made on the way


def test_an_override_into_an_unknown_section_names_the_override():
    assert _message(load_config, TINY, ["rl.seed=1"]) == \
        f"unknown section 'rl' in override 'rl.seed=1' (did you mean 'rl_config'?); known sections: {KNOWN}"


def test_an_override_with_bad_yaml_names_the_override():
    assert _message(load_config, TINY, ["rl_config.seed=[1"]).startswith("invalid YAML in override 'rl_config.seed=[1': ")


# ------------------------------------------------------------------ model files


def test_defaults_must_be_a_list_of_model_entries(tmp_path):
    path = _write(tmp_path / "c.yaml", "defaults: {model: tiny_qwen2}\n")
    assert _message(load_config, path) == f"'defaults' in {path} must be a list"
    path = _write(tmp_path / "d.yaml", "defaults:\n  - data: x\n")
    assert _message(load_config, path) == \
        f"unsupported 'defaults' entry {{'data': 'x'}} in {path}; expected '- model: <name or list of names>'"
    path = _write(tmp_path / "e.yaml", "defaults:\n  - {model: x, data: y}\n")
    assert _message(load_config, path).startswith("unsupported 'defaults' entry {'model': 'x', 'data': 'y'}")
    path = _write(tmp_path / "f.yaml", "defaults:\n  - model: [tiny_qwen2, 5]\n")
    assert _message(load_config, path) == f"model name 5 in 'defaults' of {path} is not a string"


def test_a_list_of_models_loads_each(tmp_path):
    _write(tmp_path / "model" / "other.yaml", "other:\n  num_layers: 7\n")
    path = _write(tmp_path / "c.yaml", "defaults:\n  - model: [tiny_qwen2, other]\n")
    models = load_config(path)["model"]
    assert list(models) == ["tiny_qwen2", "other"] and models["other"] == {"num_layers": 7}
    assert models["tiny_qwen2"]["num_layers"] == 2


def test_a_missing_model_file_names_every_folder_searched(tmp_path):
    path = _write(tmp_path / "cfg" / "c.yaml", "defaults:\n  - model: ghost\n")
    tried = [tmp_path / "cfg" / "model" / "ghost.yaml", tmp_path / "model" / "ghost.yaml",
             REPO_MODEL_DIR / "ghost.yaml"]
    assert _message(load_config, path, error=FileNotFoundError) == \
        f"model file for 'ghost' not found; searched: {', '.join(map(str, tried))}"


@pytest.mark.parametrize("text", ["ghost: 5\n", "other:\n  a: 1\n", "- 1\n"])
def test_a_model_file_must_map_its_name_to_settings(tmp_path, text):
    model = _write(tmp_path / "model" / "ghost.yaml", text)
    path = _write(tmp_path / "c.yaml", "defaults:\n  - model: ghost\n")
    assert _message(load_config, path) == f"model file {model} must map 'ghost' to a dict of settings"


def test_a_model_a_section_names_is_loaded_without_defaults(tmp_path):
    path = _write(tmp_path / "c.yaml", "actor_config:\n  model: tiny_qwen2\ncritic_config:\n  model: 5\n")
    assert list(load_config(path)["model"]) == ["tiny_qwen2"]  # a name that is not a string is not looked up


def test_inline_model_settings_override_the_file_and_must_be_mappings(tmp_path):
    path = _write(tmp_path / "c.yaml", "defaults:\n  - model: tiny_qwen2\nmodel:\n  tiny_qwen2:\n    num_layers: 9\n"
                                       "  inline_only:\n    hidden_size: 8\n")
    models = load_config(path)["model"]
    assert models["tiny_qwen2"]["num_layers"] == 9 and models["tiny_qwen2"]["hidden_size"] == 64
    assert models["inline_only"] == {"hidden_size": 8}
    # a model a section names but the inline section defines is not looked up in files
    path = _write(tmp_path / "d.yaml", "actor_config:\n  model: inline_only\nmodel:\n  inline_only: {num_layers: 1}\n")
    assert load_config(path)["model"] == {"inline_only": {"num_layers": 1}}
    path = _write(tmp_path / "e.yaml", "model:\n  bad: 3\n")
    assert _message(load_config, path) == f"model 'bad' in {path} must be a mapping"


# ------------------------------------------------------------------ build_configs


def test_sections_passed_in_must_be_mappings():
    cfg = load_config(TINY)
    cfg["rl_config"] = [1]
    assert _message(build_configs, cfg) == "section 'rl_config' must be a mapping"


def test_role_sections_are_refused_in_integrated_mode(tmp_path):
    path = _write(tmp_path / "c.yaml", TINY.read_text() + "reward_config:\n  micro_batch_size: 1\n")
    assert _message(build_configs, load_config(path)) == \
        "section 'reward_config' must not be set when rl_config.use_integrated_worker is true"


def test_a_critic_section_needs_ppo(tmp_path):
    cfg = load_config(TINY, ["critic_config.micro_batch_size=2"])
    assert _message(build_configs, cfg) == \
        "section 'critic_config' is read by PPO only (megatron_training.stage=ray_ppo); stage is 'ray_grpo'"
    cfgs, _ = _build(path=_write(tmp_path / "c.yaml", TINY.read_text() + "critic_config: {}\n"))  # empty: no error
    assert cfgs.critic_config is None


def test_every_role_gets_the_prompt_length_and_the_critic_its_training_settings():
    cfgs, _ = _build("rl_config.max_prompt_length=6", path=PPO)
    assert cfgs.actor_config.max_prompt_length == cfgs.critic_config.max_prompt_length == 6
    assert cfgs.ref_config is cfgs.actor_config and cfgs.reward_config is cfgs.actor_config
    assert cfgs.critic_config.lr == 2e-3 and cfgs.actor_config.lr == 1e-3  # each its own section over training


def test_a_mini_batch_larger_than_the_batch_is_the_whole_batch():
    cfgs, _ = _build("rl_config.mini_batch_size=64")
    assert cfgs.rl_config.mini_batch_size == 8 * 4 == cfgs.plan.mini_batch_rows
    cfgs, _ = _build("rl_config.mini_batch_size=8")
    assert cfgs.rl_config.mini_batch_size == 32  # equal: kept


def test_megatrons_rotary_switch_means_rope():
    cfgs, _ = _build("model.tiny_qwen2.position_embedding_type=learned_absolute",
                     "model.tiny_qwen2.use_rotary_position_embeddings=true")
    assert cfgs.actor_config.position_embedding_type == "rope"


@pytest.mark.parametrize("value, message", [
    ("'2'", "must give pipeline_model_parallel_size=2 stage sizes adding up to num_layers=2"),
    ("'1,1,0'", "must give pipeline_model_parallel_size=2 stage sizes adding up to num_layers=2"),
    ("'a,b'", None),
])
def test_num_layer_list_must_give_one_size_per_stage_adding_up(value, message):
    text = _message(_build, "actor_config.pipeline_model_parallel_size=2", f"actor_config.num_layer_list={value}")
    if message:
        assert text == f"megatron_training.num_layer_list={value.strip(chr(39))!r} {message}"
    else:
        assert text == "megatron_training.num_layer_list='a,b' must be comma-separated integers"


def test_num_layer_list_as_a_list_and_with_spaces():
    cfgs, _ = _build("actor_config.pipeline_model_parallel_size=2", "actor_config.num_layer_list=[1, 1]")
    assert cfgs.plan.layout.asked == "TP=1 x PP=2 x DP=1"
    cfgs, _ = _build("actor_config.pipeline_model_parallel_size=2", "actor_config.num_layer_list=' 1, 1 ,'")
    assert cfgs.actor_config.num_layers == 2


def test_noop_layers_are_removed_from_the_layer_count_once_each():
    cfgs, _ = _build("model.tiny_qwen2.num_layers=5", "megatron_training.noop_layers='4,0,4'")
    assert (cfgs.actor_config.num_layers, cfgs.actor_config.noop_layers) == (3, None)
    cfgs, _ = _build("model.tiny_qwen2.num_layers=4", "megatron_training.noop_layers=3")
    assert cfgs.actor_config.num_layers == 3


@pytest.mark.parametrize("noop", ["5", "'-1'", "'0,5'"])
def test_noop_layers_must_index_layers(noop):
    assert _message(_build, "model.tiny_qwen2.num_layers=5", f"megatron_training.noop_layers={noop}") == \
        f"megatron_training.noop_layers={noop.strip(chr(39)) if noop.startswith(chr(39)) else int(noop)!r} " \
        f"must index layers 0..4"


def test_a_verifier_name_must_be_a_string():
    assert _message(_build, "rl_config.verifier_function=[5]") == "rl_config.verifier_function: 5 is not a verifier name"


@pytest.mark.parametrize("override, message", [
    ("rl_config.use_dp_batch_balanse=true",
     "rl_config: unknown key 'use_dp_batch_balanse'; did you mean 'use_dp_batch_balance'?"),
    ("generate_config.sampling_config.temprature=1.0",
     "generate_config.sampling_config: unknown key 'temprature'; did you mean 'temperature'?"),
    ("model.tiny_qwen2.num_layer=2", "model tiny_qwen2: unknown key 'num_layer'; did you mean 'num_layers'?"),
])
def test_an_unknown_key_names_its_section_and_the_closest_key(override, message):
    assert _message(_build, override) == message


def test_an_unknown_key_without_a_close_one_has_no_hint():
    assert _message(_build, "rl_config.zzzzzz=1") == "rl_config: unknown key 'zzzzzz'"
    assert _message(_build, "model.tiny_qwen2.zzzzzz=1") == "model tiny_qwen2: unknown key 'zzzzzz'"


def test_dashed_keys_are_the_underscored_ones():
    cfgs, _ = _build("rl_config.use-dp-batch-balance=false")
    assert cfgs.rl_config.use_dp_batch_balance is False and cfgs.plan.balance is None
    # and their values are checked under the underscored name
    assert _message(_build, "rl_config.use-dp-batch-balance=5", error=TypeError) == \
        "rl_config.use_dp_batch_balance expects bool, got 5 (int)"


def test_sampling_and_model_values_are_type_checked_by_their_key():
    assert _message(_build, "generate_config.sampling_config.top_k=x", error=TypeError) == \
        "generate_config.sampling_config.top_k expects int, got 'x' (str)"
    assert _message(_build, "model.tiny_qwen2.num_layers=two", error=TypeError) == \
        "model.tiny_qwen2.num_layers expects int, got 'two' (str)"


# ------------------------------------------------------------------ weights and checkpoints


def test_a_checkpoint_load_that_cannot_resume_is_named(tmp_path):
    assert _message(_build, f"megatron_training.load={tmp_path}") == (
        f"megatron_training.load: checkpoint folder {str(tmp_path)!r} has no latest_checkpointed_iteration.txt "
        f"(nothing was saved there, or name an iter_XXXXXXX folder)")


def test_a_weights_only_load_of_a_folder_is_the_model_path(tmp_path):
    cfgs, _ = _build(f"megatron_training.load={tmp_path}", "megatron_training.finetune=true")
    assert cfgs.actor_config.model_path == str(tmp_path) and cfgs.actor_config.load == str(tmp_path)
    cfgs, _ = _build(f"megatron_training.load={tmp_path}", f"megatron_training.model_path={tmp_path}",
                     "megatron_training.no_load_optim=true", "megatron_training.no_load_rng=true")
    assert cfgs.actor_config.model_path == str(tmp_path)
    other = tmp_path / "other"
    assert _message(_build, f"megatron_training.load={tmp_path}", f"megatron_training.model_path={other}",
                    "megatron_training.finetune=true") == (
        f"megatron_training.load={str(tmp_path)!r} (weights only) and model_path={str(other)!r} name different "
        f"weights; set one of them")


def test_a_missing_weights_only_load_starts_from_the_model_path_and_says_so(tmp_path):
    gone, hf = str(tmp_path / "gone"), str(tmp_path / "hf")
    cfgs, notes = _build(f"megatron_training.load={gone}", f"megatron_training.model_path={hf}",
                         "megatron_training.finetune=true")
    assert cfgs.actor_config.load is None and cfgs.actor_config.model_path == hf
    assert (f"megatron_training.load={gone!r} does not exist: nothing is loaded from it (as Megatron does); "
            f"training starts from the HF weights at {hf!r}") in notes
    assert _message(_build, f"megatron_training.load={gone}", "megatron_training.finetune=true") == (
        f"megatron_training.load={gone!r} does not exist and no other weights are given: set "
        f"megatron_training.model_path to an HF weights folder")


def test_the_critic_starts_from_the_actors_weights_unless_it_names_its_own(tmp_path):
    actor_w, critic_w = str(tmp_path / "actor"), str(tmp_path / "critic")
    cfgs, _ = _build(f"megatron_training.model_path={actor_w}", path=PPO)
    assert cfgs.critic_config.model_path == actor_w
    cfgs, _ = _build(f"megatron_training.model_path={actor_w}", f"critic_config.model_path={critic_w}", path=PPO)
    assert cfgs.critic_config.model_path == critic_w and cfgs.actor_config.model_path == actor_w
    # upstream's tokenizer folder in the critic's section is not weights of its own
    cfgs, _ = _build(f"megatron_training.model_path={actor_w}", f"critic_config.tokenizer_name_or_path={critic_w}",
                     path=PPO)
    assert cfgs.critic_config.model_path == actor_w


def test_the_critic_is_saved_with_the_actor(tmp_path):
    save = str(tmp_path / "ckpt")
    cfgs, _ = _build(f"megatron_training.save={save}", f"critic_config.save={save}", path=PPO)
    assert cfgs.critic_config.save == save
    other = str(tmp_path / "elsewhere")
    for key in ("save", "load"):
        assert _message(_build, f"megatron_training.{key}={save}", f"critic_config.{key}={other}", path=PPO) == (
            f"critic_config.{key}={other!r} differs from the actor's {save!r}: the critic is saved in and loaded "
            f"from the actor's checkpoint folders; leave it unset or give the same folder")
    assert os.listdir(tmp_path) == []  # nothing was made


def test_a_megatron_format_load_names_the_key_the_file_and_the_weights_to_give(tmp_path):
    step = tmp_path / "iter_0000002"
    step.mkdir()
    for name in ("common.pt", "metadata.json", "__0_0.distcp"):
        (step / name).write_bytes(b"")
    assert _message(_build, f"megatron_training.load={tmp_path}", "megatron_training.finetune=true",
                    "megatron_training.tokenizer_name_or_path=./Qwen2.5-7B") == (
        f"megatron_training.load={str(tmp_path)!r} is a Megatron-format checkpoint ({step / 'common.pt'}), which "
        f"this implementation does not read: give the HF weights folder (config.json + *.safetensors) as "
        f"megatron_training.model_path (tokenizer_name_or_path='./Qwen2.5-7B' is taken as that folder when "
        f"model_path is unset) and remove megatron_training.load; megatron_training.load is only for checkpoints "
        f"this implementation saved")


def test_an_unknown_verifier_is_named_with_the_closest_and_the_known_ones():
    text = _message(_build, "rl_config.verifier_function=['base_ac']")
    assert text.startswith("rl_config.verifier_function: unknown verifier 'base_ac' (did you mean 'base_acc'?); "
                           "known: ")
    # every registered name is listed, then the module:function form
    assert text.split("known: ")[1] == ", ".join(verifier_names()) + ", or 'module:function'"
    assert "length_match" in verifier_names()

