"""Gradient norm and clipping in one process, over a mesh smaller than the world (ranks as threads), and the
shard sizes FSDP and TP give."""
import math

import pytest
import torch

from mindspeed_rl.models import sharding
from ut.models.rank_threads import run_ranks


def _params(*grads):
    out = []
    for g in grads:
        p = torch.nn.Parameter(torch.zeros(3 if g is None else g.shape, dtype=torch.float32 if g is None else g.dtype))
        p.grad = g
        out.append(p)
    return out


def _by_hand(params):
    return math.sqrt(sum(float(p.grad.float().pow(2).sum()) for p in params if p.grad is not None))


def test_grad_norm_is_the_l2_norm_of_every_gradient_skipping_missing_ones():
    params = _params(None, torch.tensor([3.0, 4.0]), torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16), None)
    # the bf16 gradient's norm is taken in bf16
    assert sharding.grad_norm(params) == pytest.approx(_by_hand(params), rel=1e-3)
    assert sharding.grad_norm(params[1:2]) == 5.0
    assert sharding.grad_norm(_params(None, None)) == 0.0
    assert sharding.grad_norm([]) == 0.0


def test_clip_scales_to_the_limit_and_returns_the_norm_before():
    params = _params(torch.tensor([3.0, 4.0]), None, torch.tensor([[0.0, 12.0]], dtype=torch.bfloat16))
    assert sharding.clip_grads(params, 6.5) == pytest.approx(13.0, rel=1e-6)
    assert sharding.grad_norm(params) == pytest.approx(6.5, rel=1e-2)  # bf16 rounds the scaled gradient
    torch.testing.assert_close(params[0].grad, torch.tensor([1.5, 2.0]), rtol=1e-5, atol=1e-6)


def test_a_clipped_norm_ends_under_the_limit_not_over_it():
    params = _params(torch.tensor([0.006, 0.008]))  # norm 0.01: the 1e-6 guard is 1e-4 of it
    assert sharding.clip_grads(params, 0.005) == pytest.approx(0.01)
    assert 0.0049 < sharding.grad_norm(params) < 0.005


@pytest.mark.parametrize("limit", [5.0, 6.0])
def test_a_norm_at_or_under_the_limit_is_left_as_it_is(limit):
    params = _params(torch.tensor([3.0, 4.0]))
    assert sharding.clip_grads(params, limit) == pytest.approx(5.0)
    assert torch.equal(params[0].grad, torch.tensor([3.0, 4.0]))


def test_a_non_finite_norm_leaves_the_gradients_for_the_skipped_step():
    params = _params(torch.tensor([float("inf"), 1.0]), torch.tensor([2.0]))
    assert math.isinf(sharding.clip_grads(params, 1.0))
    assert params[1].grad.item() == 2.0 and params[0].grad[1].item() == 1.0


@pytest.mark.parametrize("n,parts,sizes", [(5, 2, [3, 2]), (2, 4, [1, 1, 0, 0]), (8, 4, [2, 2, 2, 2])])
def test_planned_shards_follow_torch_chunk(n, parts, sizes):
    # dim 0 over dp (FSDP), as torch.chunk splits it; a rank past the end holds nothing
    got = [sharding.planned_local_numel("w.weight", (n, 3), parts, 1, dp_rank=r) for r in range(parts)]
    assert got == [s * 3 for s in sizes] == [c.numel() for c in torch.arange(n * 3).view(n, 3).chunk(parts)] + \
        [0] * (parts - len(torch.arange(n).chunk(parts)))


def _norm_on_a_sub_mesh(rank):
    # four ranks as two engines of two: the norm of each engine's mesh takes its own two ranks only
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2, 1), mesh_dim_names=("engine", "dp", "tp"))["dp", "tp"]
    grad = torch.tensor([3.0, 4.0]) * (1 if rank < 2 else 2)  # the same on both ranks of an engine
    return mesh.ndim, mesh.size(), sharding.grad_norm(_params(grad), mesh)


def test_the_norm_of_a_mesh_smaller_than_the_world_reduces_over_that_mesh_only():
    got = run_ranks(4, _norm_on_a_sub_mesh)
    assert [g[:2] for g in got] == [(2, 2)] * 4
    assert [g[2] for g in got] == pytest.approx([5.0, 5.0, 10.0, 10.0])


def test_planned_shards_default_to_rank_zero_of_both_splits():
    # q_proj (5 x 3) splits its rows over tp (3 + 2), then tp rank 0's 3 rows over dp (2 + 1)
    assert sharding.planned_local_numel("model.layers.0.self_attn.q_proj.weight", (5, 3), dp=2, tp=2) == 2 * 3
