"""Rollout correction in the policy loss: each token's clipped policy-gradient term times its IS weight; the KL
and entropy terms untouched; rejected tokens (mask 0) out of the loss."""
import torch

from mindspeed_rl.models.loss.grpo_loss import grpo_loss, kl_penalty


def _inputs():
    torch.manual_seed(3)
    lp = torch.randn(2, 3, dtype=torch.float64) * 0.3 - 1.0
    old = lp + torch.randn(2, 3, dtype=torch.float64) * 0.4
    ref = lp + torch.randn(2, 3, dtype=torch.float64) * 0.2
    adv = torch.tensor([1.5, -0.7], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]], dtype=torch.float64)  # token (1, 1) rejected
    weights = torch.tensor([[0.5, 2.0, 1.0], [1.7, 9.0, 0.0]], dtype=torch.float64)
    return lp, old, ref, adv, mask, weights


def test_weights_multiply_the_policy_term_only():
    lp, old, ref, adv, mask, weights = _inputs()
    loss, _ = grpo_loss(lp, old, adv, mask, clip_ratio=0.2, ref_log_probs=ref, kl_coef=0.3, is_weights=weights,
                        token_count=5.0)
    kl = kl_penalty(lp, ref, "low_var_kl")
    want = 0.0
    for b in range(2):
        for t in range(3):
            if not mask[b, t]:
                continue
            r = torch.exp(lp[b, t] - old[b, t])
            pg = max(-adv[b] * r, -adv[b] * r.clamp(0.8, 1.2))
            want = want + weights[b, t] * pg + 0.3 * kl[b, t]
    torch.testing.assert_close(loss, want / 5.0)


def test_unit_weights_are_the_plain_loss_and_gradients_follow_the_weights():
    lp, old, ref, adv, mask, weights = _inputs()
    plain, _ = grpo_loss(lp, old, adv, mask)
    ones, _ = grpo_loss(lp, old, adv, mask, is_weights=torch.ones_like(lp))
    torch.testing.assert_close(plain, ones)
    x = lp.clone().requires_grad_(True)
    grpo_loss(x, old, adv, mask, is_weights=weights, token_count=1.0)[0].backward()
    y = lp.clone().requires_grad_(True)
    grpo_loss(y, old, adv, mask, token_count=1.0)[0].backward()
    # per token, the weighted gradient is the plain one times the weight (weights carry no gradient)
    torch.testing.assert_close(x.grad, y.grad * weights * mask)


def test_weights_of_another_dtype_keep_the_loss_in_the_log_probs_dtype():
    lp, old, ref, adv, mask, weights = _inputs()
    loss, _ = grpo_loss(lp.float(), old.float(), adv.float(), mask.float(), is_weights=weights)  # float64 weights
    assert loss.dtype == torch.float32
