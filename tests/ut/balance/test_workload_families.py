"""The flops workload (a*L + b*L^2) per model family: MoE counts active experts, MLA its own dims."""
from types import SimpleNamespace

import pytest

from mindspeed_rl.models.tiny_model import tiny_config
from mindspeed_rl.balance.workload import WorkloadModel


def test_moe_counts_active_experts_only():
    # h=8, 1 layer, 2 heads (dim 4), 1 kv head, vocab 10; 16 experts of width 4, top-2, 1 shared
    m = WorkloadModel.from_dims(8, 1, 2, 99, num_kv_heads=1, vocab_size=10,
                                moe={"num_experts": 16, "topk": 2, "ffn": 4, "shared": 1})
    attn = 8 * 8 + 2 * 8 * 4 + 8 * 8
    a = 2 * (attn + 3 * 3 * 8 * 4 + 8 * 16) + 2 * 8 * 10  # 3 active experts + the router
    assert m.quadratic == pytest.approx(2 * 8 / a)
    # more experts at the same top-k add only router work
    many = WorkloadModel.from_dims(8, 1, 2, 99, num_kv_heads=1, vocab_size=10,
                                   moe={"num_experts": 1024, "topk": 2, "ffn": 4, "shared": 1})
    assert many.quadratic == pytest.approx(2 * 8 / (a + 2 * 8 * (1024 - 16)))


def test_mla_counts_its_projections_and_head_dims():
    mla = {"q_lora_rank": 6, "kv_lora_rank": 5, "qk_head_dim": 4, "qk_pos_emb_head_dim": 2, "v_head_dim": 3}
    m = WorkloadModel.from_dims(8, 1, 2, 16, vocab_size=10, mla=mla)
    attn = 8 * 6 + 6 * 2 * 6 + 8 * (5 + 2) + 5 * 2 * (4 + 3) + 2 * 3 * 8
    a = 2 * (attn + 3 * 8 * 16) + 2 * 8 * 10
    assert m.quadratic == pytest.approx(2 * (6 + 3) / a)


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen3_moe", "deepseek_v3"])
def test_megatron_keys_and_hf_config_agree(family):
    hf = tiny_config(family)
    meg = SimpleNamespace(hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
                          num_attention_heads=hf.num_attention_heads, ffn_hidden_size=hf.intermediate_size,
                          group_query_attention=True, num_query_groups=hf.num_key_value_heads,
                          padded_vocab_size=hf.vocab_size, kv_channels=getattr(hf, "head_dim", None))
    if family == "qwen3_moe":
        meg.num_experts, meg.moe_router_topk, meg.moe_ffn_hidden_size = (
            hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size)
    if family == "deepseek_v3":
        meg.kv_channels = None
        meg.num_experts, meg.moe_router_topk, meg.moe_ffn_hidden_size = (
            hf.n_routed_experts, hf.num_experts_per_tok, hf.moe_intermediate_size)
        meg.n_shared_experts, meg.first_k_dense_replace = hf.n_shared_experts, hf.first_k_dense_replace
        meg.multi_latent_attention, meg.q_lora_rank, meg.kv_lora_rank = True, hf.q_lora_rank, hf.kv_lora_rank
        meg.qk_head_dim, meg.qk_pos_emb_head_dim, meg.v_head_dim = (
            hf.qk_nope_head_dim, hf.qk_rope_head_dim, hf.v_head_dim)
    got = WorkloadModel.from_megatron_config(meg)
    assert got == WorkloadModel.from_hf_config(hf)
    dense = WorkloadModel.from_hf_config(tiny_config("llama"))
    if family in ("qwen3_moe", "deepseek_v3"):
        assert got != dense  # the family's own dims are counted


def test_mla_without_its_dims_is_an_error():
    meg = SimpleNamespace(hidden_size=8, num_layers=1, num_attention_heads=2, ffn_hidden_size=16,
                          multi_latent_attention=True, kv_lora_rank=4)
    with pytest.raises(ValueError, match="qk_head_dim"):
        WorkloadModel.from_megatron_config(meg)
