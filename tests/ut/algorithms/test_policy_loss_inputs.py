"""Every registered policy loss reads the same inputs: rollout correction's weights scale its policy-gradient
term (not the KL term), rejected tokens (mask 0) add nothing, and padding never leaks."""
import pytest
import torch

from mindspeed_rl.algorithms import POLICY_LOSSES
from mindspeed_rl.algorithms.policy_loss import actor_loss

from .conftest import LENGTHS, mask_of

MODES = [m for m in POLICY_LOSSES.names()]
OLD = torch.full((6, 4), -1.0)
LP = OLD + torch.linspace(-0.3, 0.3, 24).reshape(6, 4)
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
REF = OLD - 0.1


@pytest.mark.parametrize("mode", MODES)
def test_is_weights_scale_the_policy_term_only(mode):
    mask = mask_of(LENGTHS)
    plain, _ = actor_loss(LP, OLD, ADV, mask, loss_mode=mode)
    doubled, _ = actor_loss(LP, OLD, ADV, mask, loss_mode=mode, is_weights=torch.full((6, 4), 2.0))
    assert float(doubled) == pytest.approx(2 * float(plain))
    with_kl, m = actor_loss(LP, OLD, ADV, mask, loss_mode=mode, ref_log_probs=REF, kl_coef=0.5, kl_kind="kl",
                            is_weights=torch.full((6, 4), 2.0))
    kl = 0.5 * float(((LP - REF) * mask).sum()) / sum(LENGTHS)
    assert float(with_kl) == pytest.approx(2 * float(plain) + kl)


@pytest.mark.parametrize("mode", MODES)
def test_rejected_tokens_and_padding_add_nothing(mode):
    mask = mask_of(LENGTHS).float()
    mask[0, 1] = 0.0  # rejected by rollout correction
    lp = LP.clone()
    lp[~mask_of(LENGTHS)] = 50.0  # padding: a value that would dominate the loss if it leaked
    lp.requires_grad_(True)
    loss, _ = actor_loss(lp, OLD, ADV, mask, loss_mode=mode)
    loss.backward()
    assert torch.isfinite(loss)
    assert lp.grad[mask == 0].abs().sum() == 0
    clean, _ = actor_loss(LP, OLD, ADV, mask, loss_mode=mode)
    assert float(loss) == pytest.approx(float(clean))


def test_the_horizon_reaches_the_aggregation():
    mask = mask_of(LENGTHS)
    ten, _ = actor_loss(LP, OLD, ADV, mask, loss_agg_mode="seq-mean-token-sum-norm", horizon=10)
    width, _ = actor_loss(LP, OLD, ADV, mask, loss_agg_mode="seq-mean-token-sum-norm")  # default: the width, 4
    assert float(ten) * 10 == pytest.approx(float(width) * 4)


def test_a_zero_advantage_token_is_in_neither_clip_fraction_even_when_its_ratio_is_clipped():
    mask = mask_of([4])
    old = torch.zeros(1, 4)
    lp = torch.tensor([[0.5, -0.5, 0.5, 0.0]])  # ratios e^0.5 and e^-0.5: outside [0.8, 1.28]
    adv = torch.tensor([[0.0, 0.0, 1.0, -1.0]])
    _, m = actor_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, loss_mode="cispo")
    assert m["actor/clip_frac"] == pytest.approx(3 / 4)  # CISPO: every out-of-bounds ratio, whatever the sign
    assert m["actor/clip_frac_high"] == pytest.approx(1 / 4) and m["actor/clip_frac_low"] == 0.0


def test_only_clip_ratio_low_given_clips_the_high_side_at_one_plus_clip_ratio():
    # ratios 1.5 (advantage +1) and 0.5 (advantage -1): clip_ratio 0.2, clip_ratio_low 0.4 -> bounds [0.6, 1.2]
    old = torch.zeros(1, 2)
    log_probs = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_()
    loss, metrics = actor_loss(log_probs, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2), clip_ratio=0.2,
                               clip_ratio_low=0.4, loss_agg_mode="seq-mean-token-sum")
    # -min(1.5, 1.2) = -1.2 on the first token; -min(-0.5, -0.6) = 0.6 on the second: both clipped
    assert loss.item() == pytest.approx(-1.2 + 0.6)
    loss.backward()
    assert log_probs.grad.tolist() == [[0.0, 0.0]]  # clipped tokens pass no gradient
    assert metrics["actor/clip_frac_high"] == 0.5 and metrics["actor/clip_frac_low"] == 0.5
    high_only, _ = actor_loss(log_probs.detach(), old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2),
                              clip_ratio=0.2, clip_ratio_high=0.6, loss_agg_mode="seq-mean-token-sum")
    assert high_only.item() == pytest.approx(-1.5 + 0.8)  # [0.8, 1.6]: the first token unclipped
