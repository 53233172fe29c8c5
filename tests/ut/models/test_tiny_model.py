import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from mindspeed_rl.models.device import get_device, get_dist_backend
from mindspeed_rl.agent.tool_block import chatml_block
from mindspeed_rl.models.tiny_model import (
    BOS_ID, EOS_ID, LEN_TOKEN_BASE, PAD_ID, SEP_ID, TOOL_CALL_ID, TOOL_CLOSE_ID, TOOL_OPEN_ID, TOY_TOKENS,
    build_tiny_checkpoint, build_toy_tokenizer, length_token, tiny_qwen2_config,
)


def test_vocabulary_layout():
    assert len(TOY_TOKENS) == 32
    assert TOY_TOKENS[:10] == [str(d) for d in range(10)]
    assert TOY_TOKENS[BOS_ID] == "<bos>" and TOY_TOKENS[EOS_ID] == "<eos>"
    assert TOY_TOKENS[PAD_ID] == "<pad>" and TOY_TOKENS[SEP_ID] == "<sep>"
    assert TOY_TOKENS[LEN_TOKEN_BASE] == "<L1>" and TOY_TOKENS[23] == "<L8>"
    # the toy tool task's one-token call and the halves of the tool turn, then unused ids
    assert TOY_TOKENS[TOOL_CALL_ID] == '<tool_call>\n{"name": "secret", "arguments": {}}\n</tool_call>'
    assert TOY_TOKENS[TOOL_OPEN_ID] + "7" + TOY_TOKENS[TOOL_CLOSE_ID] == chatml_block(["7"])
    assert (TOOL_CALL_ID, TOOL_OPEN_ID, TOOL_CLOSE_ID) == (24, 25, 26)
    assert TOY_TOKENS[27] == "<unused27>" and TOY_TOKENS[31] == "<unused31>"
    assert [length_token(n) for n in (1, 8)] == [16, 23]
    with pytest.raises(ValueError):
        length_token(9)


def test_config_fields_and_overrides():
    cfg = tiny_qwen2_config()
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (32, 64, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (4, 2, 128)
    assert cfg.tie_word_embeddings and cfg.max_position_embeddings == 64
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    assert tiny_qwen2_config(num_hidden_layers=1).num_hidden_layers == 1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return build_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "ckpt", seed=3)


def test_tokenizer_round_trip(checkpoint):
    tok = AutoTokenizer.from_pretrained(checkpoint)
    assert len(tok) == 32
    assert tok.convert_tokens_to_ids(TOY_TOKENS) == list(range(32))
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    # the reloaded tokenizer and the in-memory one agree on text with and without spaces
    fresh = build_toy_tokenizer()
    for text in ["<bos> <L3> <sep>", "<bos>123<sep>", "<bos> 4 5 6 <sep> 4 5 6 <eos>", "1+2="]:
        assert tok(text).input_ids == fresh(text).input_ids
    assert tok("<bos> <L3> <sep>").input_ids == [BOS_ID, length_token(3), SEP_ID]
    assert tok("<bos>407<sep>").input_ids == [BOS_ID, 4, 0, 7, SEP_ID]
    assert tok.decode([BOS_ID, 4, 0, 7, SEP_ID], skip_special_tokens=True) == "407"


def test_model_round_trip(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert model.config.model_type == "qwen2" and model.config.vocab_size == 32
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    ids = torch.tensor([[BOS_ID, 1, 2, 3, SEP_ID]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, 5, 32) and torch.isfinite(logits).all()


def test_seed_controls_weights(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(build_tiny_checkpoint(tmp_path / "a", seed=1))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_checkpoint(tmp_path / "b", seed=1))
    c = AutoModelForCausalLM.from_pretrained(build_tiny_checkpoint(tmp_path / "c", seed=2))
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb)
    assert not torch.equal(wa, wc)


def test_device_helpers_on_cpu():
    assert get_device(0).type in ("cpu", "cuda", "npu")
    if not torch.cuda.is_available():
        assert get_device(5) == torch.device("cpu")
    assert get_dist_backend(torch.device("cpu")) == "gloo"
    assert get_dist_backend(torch.device("cuda", 1)) == "nccl"
    assert get_dist_backend("npu:3") == "hccl"
    with pytest.raises(ValueError):
        get_dist_backend(torch.device("meta"))


def test_get_device_picks_accelerator_by_local_rank(monkeypatch):
    import mindspeed_rl.models.device as device_mod
    monkeypatch.setattr(device_mod, "_npu_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert get_device(6) == torch.device("cuda", 2)
    assert get_device() == torch.device("cuda", 0)


@pytest.mark.parametrize("family,cls", [("qwen3", "Qwen3ForCausalLM"), ("llama", "LlamaForCausalLM"),
                                        ("qwen3_moe", "Qwen3MoeForCausalLM"),
                                        ("deepseek_v3", "DeepseekV3ForCausalLM")])
def test_tiny_checkpoint_of_every_family(tmp_path, family, cls):
    from mindspeed_rl.config_cls.model_arch import checkpoint_family
    path = build_tiny_checkpoint(tmp_path / family, model_type=family, num_hidden_layers=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == cls and model.config.num_hidden_layers == 1
    assert checkpoint_family(path) == family


def test_unknown_family_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="model_type 'gpt9'"):
        build_tiny_checkpoint(tmp_path / "x", model_type="gpt9")


def _section(**keys):
    from types import SimpleNamespace
    base = dict(num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, kv_channels=16,
                group_query_attention=True, num_query_groups=2, vocab_size=32, padded_vocab_size=32,
                make_vocab_size_divisible_by=1, max_position_embeddings=64, rotary_base=10000.0,
                norm_epsilon=1e-6, attention_dropout=0.0, init_method_std=0.02,
                untie_embeddings_and_output_weights=False, add_qkv_bias=False)
    base.update(keys)
    return SimpleNamespace(**base)


def test_model_section_picks_the_family_and_a_wrong_checkpoint_is_named(tmp_path):
    from mindspeed_rl.config_cls import model_arch
    assert model_arch.model_family(_section(add_qkv_bias=True)) == "qwen2"
    assert model_arch.model_family(_section()) == "llama"
    assert model_arch.model_family(_section(qk_layernorm=True)) == "qwen3"
    assert model_arch.model_family(_section(qk_layernorm=True, num_experts=4)) == "qwen3_moe"
    assert model_arch.model_family(_section(multi_latent_attention=True, kv_lora_rank=16)) == "deepseek_v3"
    moe = _section(qk_layernorm=True, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32)
    kwargs = model_arch.hf_config_kwargs(moe)
    assert (kwargs["model_type"], kwargs["num_experts"], kwargs["num_experts_per_tok"],
            kwargs["moe_intermediate_size"]) == ("qwen3_moe", 4, 2, 32)
    path = build_tiny_checkpoint(tmp_path / "moe", **kwargs)
    model_arch.check_against_checkpoint(moe, path)  # the section's own checkpoint matches
    with pytest.raises(ValueError, match="Qwen3ForCausalLM.*qwen3_moe"):
        model_arch.check_against_checkpoint(_section(qk_layernorm=True), path)
    with pytest.raises(ValueError, match="moe_intermediate_size=64"):
        model_arch.check_against_checkpoint(_section(qk_layernorm=True, num_experts=4, moe_router_topk=2,
                                                     moe_ffn_hidden_size=64), path)
