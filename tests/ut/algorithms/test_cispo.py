"""CISPO against a reference: loss = sum(-clip(r).detach() * A * logp) / tokens; a token whose ratio is clipped
keeps its gradient (-clip(r) * A / tokens), where PPO's clip gives it none."""
import pytest
import torch

from mindspeed_rl.algorithms.policy_loss import actor_loss

from .conftest import LENGTHS, mask_of

OLD = torch.full((6, 4), -1.0)
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])


def test_loss_and_gradient_match_the_reference():
    base = OLD + torch.linspace(-0.6, 0.6, 24).reshape(6, 4)
    lp = base.clone().requires_grad_(True)
    loss, m = actor_loss(lp, OLD, ADV, mask_of(LENGTHS), clip_ratio_low=0.2, clip_ratio_high=0.28,
                         loss_mode="cispo")
    loss.backward()
    mask = mask_of(LENGTHS)
    ratio = torch.exp(base - OLD)
    weight = torch.clamp(ratio, 0.8, 1.28)
    tokens = sum(LENGTHS)
    want = sum(float(-weight[i, t] * ADV[i] * base[i, t]) for i, n in enumerate(LENGTHS) for t in range(n)) / tokens
    assert float(loss.detach()) == pytest.approx(want, rel=1e-5)
    want_grad = torch.where(mask, -weight * ADV[:, None] / tokens, 0.0)
    assert torch.allclose(lp.grad, want_grad, atol=1e-7)
    clipped = (ratio != weight) & mask
    assert m["actor/clip_frac"] == pytest.approx(float(clipped.sum()) / tokens)
    # a token clipped above with a positive advantage still learns under CISPO; PPO's clip gives it no gradient
    i, t = [int(x) for x in ((ratio > 1.28) & mask & (ADV[:, None] > 0)).nonzero()[0]]
    assert lp.grad[i, t] != 0
    ppo = base.clone().requires_grad_(True)
    actor_loss(ppo, OLD, ADV, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)[0].backward()
    assert ppo.grad[i, t] == 0
