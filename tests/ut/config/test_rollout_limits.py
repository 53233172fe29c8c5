"""The rollout settings vLLM would refuse or run poorly, found with the config: a max_model_len above the model's
max_position_embeddings (an error before Ray), max_num_seqs=1 (a warning)."""
import json
import os
import warnings

import pytest

from mindspeed_rl.plan import rollout_spec as rs
from mindspeed_rl.plan.loader import build_configs, load_config
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.plan.rollout_spec import RolloutSpec, check_model_len, model_len_limit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TINY = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
# vLLM's CPU attention needs a head size of 32 or more: 2 heads of 32 in the tiny model
VLLM = ["generate_config.rollout_backend=vllm", "megatron_training.num_attention_heads=2",
        "megatron_training.num_query_groups=2"]


def _section(max_position_embeddings=64):
    return MegatronConfig({"model": "m"}, {"m": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                                 "max_position_embeddings": max_position_embeddings}})


def _checkpoint(folder, **cfg):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return str(folder)


def _spec(backend="vllm", max_model_len=128, max_num_seqs=4):
    return RolloutSpec(backend, "test", max_model_len=max_model_len, max_num_seqs=max_num_seqs)


def test_a_max_model_len_above_the_sections_limit_is_refused_for_vllm_only(monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    with pytest.raises(ValueError) as info:
        check_model_len(_spec(max_model_len=65), _section(64), "/no/such/model")
    assert str(info.value) == ("generate_config.max_model_len=65 exceeds the model's max_position_embeddings=64 "
                               "(the model section): vLLM cannot serve it; lower generate_config.max_model_len")
    check_model_len(_spec(max_model_len=64), _section(64))  # the limit itself is fine
    check_model_len(_spec("hf", max_model_len=65), _section(64))  # transformers generate has no such limit
    check_model_len(_spec(max_model_len=10 ** 6), MegatronConfig({}, {}))  # nothing says the limit: vLLM decides


def test_the_checkpoints_config_json_is_read_first_with_vllms_rope_factor(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    path = _checkpoint(tmp_path / "a", max_position_embeddings=32)
    assert model_len_limit(_section(64), path) == (32, os.path.join(path, "config.json"))
    with pytest.raises(ValueError, match=r"max_model_len=48 exceeds the model's max_position_embeddings=32 \(.*/a/"
                                         r"config\.json\)"):
        check_model_len(_spec(max_model_len=48), _section(64), path)
    # vLLM multiplies by a linear / dynamic RoPE factor, not by YaRN's or Llama 3's
    linear = _checkpoint(tmp_path / "b", max_position_embeddings=32, rope_scaling={"rope_type": "linear", "factor": 4})
    assert model_len_limit(None, linear)[0] == 128
    yarn = _checkpoint(tmp_path / "c", max_position_embeddings=32,
                       rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    assert model_len_limit(None, yarn)[0] == 32
    nested = _checkpoint(tmp_path / "d", text_config={"max_position_embeddings": 16})
    assert model_len_limit(None, nested)[0] == 16
    broken = tmp_path / "f"
    broken.mkdir()
    (broken / "config.json").write_text("{")
    with pytest.raises(ValueError, match=r"/f/config\.json: not valid JSON \(Expecting"):
        model_len_limit(_section(64), str(broken))
    # a config.json without the key: the section's
    assert model_len_limit(_section(64), _checkpoint(tmp_path / "e", hidden_size=8)) == (64, "the model section")


def test_vllms_own_override_variable_lets_it_through(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    check_model_len(_spec(max_model_len=65), _section(64))


def test_max_num_seqs_1_with_vllm_warns_what_it_means():
    from types import SimpleNamespace

    from mindspeed_rl.plan.idle_keys import idle_key_lines
    from mindspeed_rl.config_cls.rl_config import RLConfig

    def lines(spec):
        plan = SimpleNamespace(worker=SimpleNamespace(rollout=spec, loss=SimpleNamespace(agg_mode="token-mean")),
                               features=SimpleNamespace(estimator="group_norm"), partial=None)
        return idle_key_lines(RLConfig({}), plan)
    assert lines(_spec(max_num_seqs=2)) == [] and lines(_spec("hf", max_num_seqs=1)) == []
    assert lines(_spec(max_num_seqs=1)) == [
        "generate_config.max_num_seqs=1 with the vLLM backend: each engine runs one request at a time, so its rows "
        "are decoded one after another with no batching and it takes one row at a time from the rollout queue; "
        "raise it (e.g. to the rows an engine takes per iteration) to batch rows within an engine"]


def test_build_configs_runs_both_checks_on_the_resolved_backend(monkeypatch):
    monkeypatch.setattr(rs, "vllm_version", lambda: "0.0-test")  # as if vLLM were installed
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    base = ["megatron_training.model_path=/unused"] + VLLM
    with pytest.raises(ValueError, match=r"^generate_config\.max_model_len=128 exceeds the model's "
                                         r"max_position_embeddings=64 \(the model section\)"):
        build_configs(load_config(TINY, base + ["generate_config.max_model_len=128"]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_configs(load_config(TINY, base))  # max_num_seqs: its default, 1
        build_configs(load_config(TINY, base + ["generate_config.max_num_seqs=8"]))
        build_configs(load_config(TINY, ["megatron_training.model_path=/unused", "generate_config.max_model_len=128"]))
    assert sum("max_num_seqs=1 with the vLLM backend" in str(w.message) for w in caught) == 1


def test_rope_factors_of_every_spelling_and_unscaled_or_odd_entries(tmp_path):
    # rope_parameters (transformers 5's name) with a linear factor scales; the old 'type' key names the kind too
    params = _checkpoint(tmp_path / "p", max_position_embeddings=32, rope_parameters={"rope_type": "linear",
                                                                                      "factor": 2})
    assert model_len_limit(None, params)[0] == 64
    old = _checkpoint(tmp_path / "t", max_position_embeddings=32, rope_scaling={"type": "yarn", "factor": 4})
    assert model_len_limit(None, old)[0] == 32  # YaRN by its old key: vLLM leaves the limit as it is
    dynamic = _checkpoint(tmp_path / "y", max_position_embeddings=32, rope_scaling={"type": "dynamic", "factor": 3})
    assert model_len_limit(None, dynamic)[0] == 96
    odd = _checkpoint(tmp_path / "o", max_position_embeddings=32, rope_scaling=[1, 2])  # not a mapping: unscaled
    assert model_len_limit(None, odd)[0] == 32
    none = _checkpoint(tmp_path / "n", rope_scaling=[1, 2])  # no limit at all, whatever the rope entry
    assert model_len_limit(_section(20), none) == (20, "the model section")
    assert model_len_limit(MegatronConfig({}, {}), str(tmp_path / "missing")) is None  # nothing says it
    from types import SimpleNamespace
    assert model_len_limit(SimpleNamespace(), None) is None  # a config object without the key at all


@pytest.mark.parametrize("value,allowed", [("1", True), ("True", True), (" true ", True), ("0", False),
                                           ("yes", False)])
def test_vllms_override_variable_is_read_as_vllm_reads_it(monkeypatch, value, allowed):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", value)
    if allowed:
        check_model_len(_spec(max_model_len=65), _section(64))
    else:
        with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings=64"):
            check_model_len(_spec(max_model_len=65), _section(64))
