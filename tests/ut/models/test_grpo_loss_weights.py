"""grpo_loss with fractional mask weights, one non-empty sequence under sequence-level
normalisation, and a small positive advantage clipped at the high end."""
import pytest
import torch

from mindspeed_rl.models.loss.grpo_loss import grpo_loss


def test_fractional_mask_weights_the_loss_and_the_metric_alike():
    """A mask value is a token weight: loss and actor/pg_loss are sum(w * pg) / sum(w)."""
    lp = torch.zeros(1, 3)
    mask = torch.tensor([[0.5, 2.0, 0.0]])
    adv = torch.tensor([[1.0, 3.0, 7.0]])
    want = -(0.5 * 1.0 + 2.0 * 3.0) / 2.5
    loss, m = grpo_loss(lp, None, adv, mask)
    assert float(loss) == pytest.approx(want)
    assert m["actor/pg_loss"] == pytest.approx(want)


def test_one_non_empty_sequence_is_divided_by_one():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    loss, _ = grpo_loss(torch.zeros(2, 3), None, torch.tensor([3.0, 5.0]), mask, token_level_loss=False)
    assert float(loss) == pytest.approx(-3.0)


def test_small_positive_advantage_clipped_high_is_not_counted_low():
    lp = torch.log(torch.tensor([[1.4, 1.0]]))  # ratio 1.4 clipped at 1.2 for a positive advantage
    _, m = grpo_loss(lp, torch.zeros(1, 2), torch.tensor([0.5]), torch.ones(1, 2), clip_ratio=0.2)
    assert m["actor/clip_frac"] == pytest.approx(0.5)
    assert m["actor/clip_frac_high"] == pytest.approx(0.5)
    assert m["actor/clip_frac_low"] == 0.0
