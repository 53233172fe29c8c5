"""WorkloadModel coefficients against the FLOP formulas written out, config key reading, input coercion."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mindspeed_rl.balance.workload import WorkloadModel, sequence_workloads


def _dense_ratio(h, layers, heads, ffn, kv_heads=None, vocab=0, head_dim=None):
    d = head_dim or h // heads
    q, kv = heads * d, (kv_heads or heads) * d
    a = 2 * (layers * (2 * h * q + 2 * h * kv) + layers * 3 * h * ffn) + 2 * h * vocab
    return layers * 2 * q / a


def _mla_attn(h, heads, q_lora, kv_lora, qk, rope, v):
    qkd = qk + rope
    q_proj = (h * q_lora + q_lora * heads * qkd) if q_lora else h * heads * qkd
    return q_proj + h * (kv_lora + rope) + kv_lora * heads * (qk + v) + heads * v * h, heads * (qkd + v)


def test_dense_exact_without_vocab():
    m = WorkloadModel.from_dims(64, 3, 4, 160)
    assert m.linear == 1.0
    assert m.quadratic == pytest.approx(_dense_ratio(64, 3, 4, 160), rel=1e-12)


def test_head_dim_floor_when_heads_do_not_divide():
    m = WorkloadModel.from_dims(100, 2, 3, 50)
    assert m.quadratic == pytest.approx(_dense_ratio(100, 2, 3, 50, head_dim=33), rel=1e-12)


@pytest.mark.parametrize("name", ["hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size"])
@pytest.mark.parametrize("bad", [0, -4])
def test_non_positive_dimension_named(name, bad):
    dims = dict(hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=128)
    dims[name] = bad
    with pytest.raises(ValueError, match=f"positive {name}, got {bad}"):
        WorkloadModel.from_dims(**dims)


def test_moe_without_shared_and_with_dense_layers():
    h, layers, heads, ffn = 64, 4, 4, 256
    moe = {"num_experts": 8, "topk": 2, "ffn": 32, "dense_layers": 1}
    m = WorkloadModel.from_dims(h, layers, heads, ffn, moe=moe)
    attn = 4 * h * h
    active = 2 * 3 * h * 32 + h * 8
    a = 2 * (layers * attn + 1 * 3 * h * ffn + 3 * active)
    assert m.quadratic == pytest.approx(layers * 2 * h / a, rel=1e-12)
    # no dense_layers key: every layer is MoE
    m0 = WorkloadModel.from_dims(h, layers, heads, ffn, moe={"num_experts": 8, "topk": 2, "ffn": 32})
    a0 = 2 * (layers * attn + layers * active)
    assert m0.quadratic == pytest.approx(layers * 2 * h / a0, rel=1e-12)


@pytest.mark.parametrize("q_lora", [None, 0, 24])
def test_mla_q_projection(q_lora):
    h, layers, heads = 64, 2, 4
    mla = {"q_lora_rank": q_lora, "kv_lora_rank": 16, "qk_head_dim": 12, "qk_pos_emb_head_dim": 4, "v_head_dim": 8}
    m = WorkloadModel.from_dims(h, layers, heads, 96, mla=mla)
    attn, pair = _mla_attn(h, heads, q_lora or 0, 16, 12, 4, 8)
    a = 2 * (layers * attn + layers * 3 * h * 96)
    assert m.quadratic == pytest.approx(layers * pair / a, rel=1e-12)


def test_cost_no_integer_overflow():
    m = WorkloadModel(linear=1.0, quadratic=1.0)
    big = 4_000_000_000
    assert m.cost([big])[0] == pytest.approx(float(big) * big + big, rel=1e-12)


def test_to_numpy_coercion():
    t = torch.tensor([[3.0, 4.0]], requires_grad=True)  # needs detach
    out = sequence_workloads(t, torch.tensor([1.0, 2.0]))
    assert out.tolist() == [4.0, 6.0]
    ints = sequence_workloads([[1, 2], [3, 4]])
    assert ints.dtype == np.float64 and ints.shape == (4,)
    assert sequence_workloads([1, 2], [3, 4]).dtype == np.float64


def test_flops_without_model_message():
    with pytest.raises(ValueError, match=r"^objective 'flops' needs a WorkloadModel \(model dimensions\)$"):
        sequence_workloads([1], objective="flops")


def _hf(**kw):
    base = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    base.update(kw)
    return SimpleNamespace(**base)


def test_hf_without_vocab_and_with_head_dim():
    assert WorkloadModel.from_hf_config(_hf()).quadratic == pytest.approx(_dense_ratio(64, 2, 4, 128), rel=1e-12)
    m = WorkloadModel.from_hf_config(_hf(head_dim=32, vocab_size=0))
    assert m.quadratic == pytest.approx(_dense_ratio(64, 2, 4, 128, head_dim=32), rel=1e-12)


def test_hf_moe_dense_layers():
    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    want = WorkloadModel.from_dims(64, 2, 4, 128, moe={"num_experts": 8, "topk": 2, "ffn": 32, "dense_layers": 1})
    got = WorkloadModel.from_hf_config(_hf(mlp_only_layers=[0], **moe))
    assert got == want
    got = WorkloadModel.from_hf_config(_hf(first_k_dense_replace=1, **moe))
    assert got == want
    assert WorkloadModel.from_hf_config(_hf(**moe)) != want


def _mg(**kw):
    base = dict(hidden_size=64, num_layers=2, num_attention_heads=4, ffn_hidden_size=128)
    base.update(kw)
    return SimpleNamespace(**base)


def test_megatron_gqa_only_when_flagged():
    plain = WorkloadModel.from_megatron_config(_mg())
    assert WorkloadModel.from_megatron_config(_mg(num_query_groups=1)) == plain
    assert WorkloadModel.from_megatron_config(_mg(num_query_groups=1, group_query_attention=False)) == plain
    gqa = WorkloadModel.from_megatron_config(_mg(num_query_groups=1, group_query_attention=True))
    assert gqa.quadratic == pytest.approx(_dense_ratio(64, 2, 4, 128, kv_heads=1), rel=1e-12)


def test_megatron_vocab_and_kv_channels():
    assert WorkloadModel.from_megatron_config(_mg()).quadratic == pytest.approx(
        _dense_ratio(64, 2, 4, 128), rel=1e-12)
    m = WorkloadModel.from_megatron_config(_mg(kv_channels=32))
    assert m.quadratic == pytest.approx(_dense_ratio(64, 2, 4, 128, head_dim=32), rel=1e-12)


def test_megatron_moe_keys():
    def want(topk, ffn):
        return WorkloadModel.from_dims(64, 2, 4, 128, moe={"num_experts": 8, "topk": topk, "ffn": ffn})
    assert WorkloadModel.from_megatron_config(_mg(num_experts=8, moe_router_topk=4, moe_ffn_hidden_size=32)) \
        == want(4, 32)
    # default top-2, expert width falls back to ffn_hidden_size
    assert WorkloadModel.from_megatron_config(_mg(num_experts=8)) == want(2, 128)


def test_megatron_mla_by_flag_or_key():
    mla = dict(kv_lora_rank=16, qk_head_dim=12, v_head_dim=8)
    want = WorkloadModel.from_dims(64, 2, 4, 128, mla={"q_lora_rank": None, "kv_lora_rank": 16, "qk_head_dim": 12,
                                                       "qk_pos_emb_head_dim": 0, "v_head_dim": 8})
    assert WorkloadModel.from_megatron_config(_mg(**mla)) == want
    assert WorkloadModel.from_megatron_config(_mg(multi_latent_attention=True, **mla)) == want
    assert want != WorkloadModel.from_megatron_config(_mg())
    with pytest.raises(ValueError, match="needs model keys kv_lora_rank, qk_head_dim, v_head_dim for"):
        WorkloadModel.from_megatron_config(_mg(multi_latent_attention=True))
