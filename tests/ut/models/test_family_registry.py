"""Model families register themselves (mindspeed_rl/families/): the shipped five with their rules, and a family
added in one module reaches every place that reads family facts: the pick from a model section, the HF config,
the key checks, TP, vLLM's head size and the tiny test model."""
from types import SimpleNamespace

import pytest

from mindspeed_rl import families as reg
from mindspeed_rl.config_cls import model_arch
from mindspeed_rl.families import Family
from mindspeed_rl.models.tiny_model import tiny_config
from mindspeed_rl.plan import layout, rollout_spec
from mindspeed_rl.plan.run_plan import PlanError


def _section(**kw):
    base = dict(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, kv_channels=None,
                group_query_attention=True, num_query_groups=2, add_qkv_bias=False, padded_vocab_size=None,
                vocab_size=None, untie_embeddings_and_output_weights=False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_the_shipped_families():
    assert {name: f.architecture for name, f in reg.families().items()} == {
        "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


@pytest.mark.parametrize("keys,family", [
    ({}, "llama"), (dict(add_qkv_bias=True), "qwen2"), (dict(qk_layernorm=True, add_qkv_bias=True), "qwen3"),
    (dict(num_experts=4, qk_layernorm=True), "qwen3_moe"), (dict(kv_lora_rank=16, num_experts=4), "deepseek_v3"),
    (dict(multi_latent_attention=True), "deepseek_v3"), (dict(q_lora_rank=8), "deepseek_v3")])
def test_the_rules_pick_by_priority(keys, family):
    assert model_arch.model_family(_section(**keys)) == family


def test_an_unknown_family_is_one_error():
    with pytest.raises(ValueError, match=r"unknown model family 'gpt2'; known: \['deepseek_v3', 'llama'"):
        reg.family("gpt2")


@pytest.fixture
def tiny_family(monkeypatch):
    """A family registered as a new module would register it: picked by a key of its own."""
    monkeypatch.setattr(reg, "_FAMILIES", dict(reg.families()))
    return reg.register(Family(
        name="mistral", architecture="MistralForCausalLM", priority=50,
        picks=lambda cfg: bool(getattr(cfg, "sliding_window", None)), mapped={"sliding_window": "sliding_window"},
        tp_sizes=lambda cfg, splits: [("hidden_size", cfg.hidden_size)], vllm_head_size=lambda cfg: 8,
        key_error=lambda cfg: "too wide" if cfg.hidden_size > 64 else None, tiny=dict(head_dim=16)))


def test_a_new_family_reaches_every_reader(tiny_family):
    cfg = _section(sliding_window=32)
    assert model_arch.model_family(cfg) == "mistral"
    kwargs = model_arch.hf_config_kwargs(cfg)
    assert kwargs["model_type"] == "mistral" and kwargs["sliding_window"] == 32 and kwargs["num_key_value_heads"] == 2
    model_arch.check_fixed(_section(sliding_window=32, disable_bias_linear=True, position_embedding_type="rope",
                                    normalization="RMSNorm", swiglu=True, hidden_dropout=0.0,
                                    attention_softmax_in_fp32=True))
    with pytest.raises(ValueError, match="too wide"):
        model_arch.check_fixed(_section(sliding_window=32, hidden_size=128, disable_bias_linear=True,
                                        position_embedding_type="rope", normalization="RMSNorm", swiglu=True,
                                        hidden_dropout=0.0, attention_softmax_in_fp32=True))
    with pytest.raises(PlanError, match="tensor_model_parallel_size=3 does not divide the model's hidden_size=64"):
        layout.check_tp_divides_model(cfg, 3)
    layout.check_tp_divides_model(cfg, 4)  # its own sizes, not the heads (4 heads, 2 KV heads)
    assert rollout_spec.model_head_size(cfg) == 8
    assert tiny_config("mistral").head_dim == 16


def test_a_family_registered_twice_is_refused(tiny_family):
    with pytest.raises(ValueError, match="model family 'mistral' is registered twice"):
        reg.register(Family(name="mistral", architecture="X", priority=1, picks=lambda cfg: False))


def test_kv_heads_follow_grouped_query_attention():
    assert model_arch.hf_config_kwargs(_section())["num_key_value_heads"] == 2
    assert model_arch.hf_config_kwargs(_section(group_query_attention=False))["num_key_value_heads"] == 4
    assert model_arch.hf_config_kwargs(_section(kv_lora_rank=16))["num_key_value_heads"] == 4  # MLA: one per head


def test_a_registry_without_a_default_family_says_so(monkeypatch):
    monkeypatch.setattr(reg, "_FAMILIES", {"qwen3": reg.family("qwen3")})
    with pytest.raises(ValueError, match="^no model family matches the model section$"):
        reg.pick(_section())
