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
