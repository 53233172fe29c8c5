import numpy as np
import pytest
import torch
from transformers import Qwen2Config

from mindspeed_rl.balance.workload import WorkloadModel, sequence_workloads


def test_tokens_objective_sums_lengths():
    got = sequence_workloads(torch.tensor([3, 5]), [10, 20])
    assert got.tolist() == [13, 25]


def test_flops_quadratic_share_grows_with_length_and_shrinks_with_width():
    small = WorkloadModel.from_dims(64, 2, 4, 128, num_kv_heads=2, vocab_size=32)
    big = WorkloadModel.from_dims(3584, 28, 28, 18944, num_kv_heads=4, vocab_size=152064)
    assert small.quadratic > big.quadratic > 0
    cost = big.cost([1024, 8192])
    assert cost[1] / cost[0] > 8  # super-linear in length


def test_flops_coefficients_match_hand_count():
    # h=8, 1 layer, 2 heads (dim 4), 1 kv head, ffn 16, vocab 10
    m = WorkloadModel.from_dims(8, 1, 2, 16, num_kv_heads=1, vocab_size=10)
    a = 2 * (8 * 8 + 2 * 8 * 4 + 8 * 8 + 3 * 8 * 16) + 2 * 8 * 10
    assert m.quadratic == pytest.approx(2 * 8 / a)


def test_from_hf_config_matches_dims():
    cfg = Qwen2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128)
    assert WorkloadModel.from_hf_config(cfg) == WorkloadModel.from_dims(64, 2, 4, 128, 2, 32)


def test_errors():
    with pytest.raises(ValueError, match="objective"):
        sequence_workloads([1], [1], objective="time")
    with pytest.raises(ValueError, match="WorkloadModel"):
        sequence_workloads([1], [1], objective="flops")
    with pytest.raises(ValueError, match="shape"):
        sequence_workloads([1, 2], [1])
    with pytest.raises(ValueError, match="hidden_size"):
        WorkloadModel.from_dims(0, 1, 1, 1)


def test_flops_objective_orders_by_cost():
    m = WorkloadModel(1.0, 0.01)
    got = sequence_workloads(np.array([10, 100]), np.array([0, 0]), "flops", m)
    assert got.tolist() == pytest.approx([11.0, 200.0])
