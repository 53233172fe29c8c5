"""GSPO against a sequence-level reference: s_i = exp(mean_t(logp - old)) clipped per sequence. With
seq-mean-token-mean the token form must give the reference's loss and gradient exactly."""
import math

import pytest
import torch

from mindspeed_rl.algorithms.policy_loss import actor_loss

from .conftest import LENGTHS, mask_of

torch.manual_seed(0)
OLD = -torch.rand(6, 4) - 0.5
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])


def reference(lp, low, high):
    total = 0.0
    for i, n in enumerate(LENGTHS):
        s = torch.exp((lp[i, :n] - OLD[i, :n]).mean())
        a = ADV[i]
        total = total + torch.maximum(-a * s, -a * torch.clamp(s, 1 - low, 1 + high))
    return total / len(LENGTHS)


@pytest.mark.parametrize("shift", [0.0, 0.05, 0.6])  # inside the clip, near it, far outside
def test_loss_and_gradient_match_the_sequence_reference(shift):
    base = OLD + shift * torch.linspace(-1, 1, 24).reshape(6, 4)
    lp = base.clone().requires_grad_(True)
    loss, m = actor_loss(lp, OLD, ADV, mask_of(LENGTHS), clip_ratio_low=3e-4, clip_ratio_high=4e-4,
                         loss_mode="gspo", loss_agg_mode="seq-mean-token-mean")
    loss.backward()
    ref_lp = base.clone().requires_grad_(True)
    want = reference(ref_lp, 3e-4, 4e-4)
    want.backward()
    assert float(loss) == pytest.approx(float(want), rel=1e-5)
    assert torch.allclose(lp.grad, ref_lp.grad, atol=1e-6)
    assert lp.grad[~mask_of(LENGTHS)].abs().sum() == 0


def test_one_ratio_per_sequence_clips_whole_sequences():
    # row 0: per-token ratios straddle 1 but their geometric mean is exp(0.2): clipped as one sequence
    lp = OLD.clone()
    lp[0, :4] += torch.tensor([0.5, -0.1, 0.3, 0.1])
    _, m = actor_loss(lp, OLD, ADV, mask_of(LENGTHS), clip_ratio=0.2, loss_mode="gspo")
    assert m["actor/clip_frac"] == pytest.approx(4 / sum(LENGTHS))  # the 4 tokens of row 0, none other
    assert math.exp(0.2) > 1.2


def test_non_finite_log_probs_on_padding_never_reach_the_sequence_ratio():
    mask = mask_of(LENGTHS)
    lp = OLD + 0.01
    dirty = torch.where(mask, lp, torch.full_like(lp, float("inf")))
    clean_loss, _ = actor_loss(lp, OLD, ADV, mask, loss_mode="gspo")
    loss, _ = actor_loss(dirty, OLD, ADV, mask, loss_mode="gspo")
    assert torch.isfinite(loss) and float(loss) == pytest.approx(float(clean_loss))
