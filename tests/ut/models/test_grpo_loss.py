import math

import pytest
import torch

from mindspeed_rl.models.loss.grpo_loss import compute_group_norm_advantages, grpo_loss, kl_penalty


# ---------- advantages ----------

def test_group_norm_advantages_hand_values():
    rewards = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0, 3.0])
    adv = compute_group_norm_advantages(rewards, n_samples=3, eps=0.0)
    # group 1: mean 2, unbiased std 1; group 2: mean 1, unbiased std sqrt(3)
    s = math.sqrt(3.0)
    assert torch.allclose(adv, torch.tensor([-1.0, 0.0, 1.0, -1 / s, -1 / s, 2 / s]), atol=1e-6)


def test_group_norm_advantages_eps_and_zero_variance():
    adv = compute_group_norm_advantages(torch.tensor([0.0, 1.0, 0.7, 0.7]), n_samples=2)
    std = math.sqrt(0.5)
    assert torch.allclose(adv[:2], torch.tensor([-0.5, 0.5]) / (std + 1e-6))
    assert torch.equal(adv[2:], torch.zeros(2))
    assert torch.equal(compute_group_norm_advantages(torch.tensor([3.0, -1.0]), n_samples=1), torch.zeros(2))


def test_group_norm_advantages_errors():
    with pytest.raises(ValueError):
        compute_group_norm_advantages(torch.zeros(5), n_samples=2)
    with pytest.raises(ValueError):
        compute_group_norm_advantages(torch.zeros(4), n_samples=0)


# ---------- KL ----------

def test_kl_kinds_hand_values():
    logp = torch.tensor([math.log(0.5), -1.0])
    ref = torch.tensor([math.log(0.25), -1.0])
    log2 = math.log(2.0)
    assert torch.allclose(kl_penalty(logp, ref, "kl"), torch.tensor([log2, 0.0]))
    assert torch.allclose(kl_penalty(ref, logp, "abs"), torch.tensor([log2, 0.0]))
    assert torch.allclose(kl_penalty(logp, ref, "mse"), torch.tensor([0.5 * log2 ** 2, 0.0]))
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + log 2 - 1
    assert torch.allclose(kl_penalty(logp, ref, "low_var_kl"), torch.tensor([log2 - 0.5, 0.0]))


def test_low_var_kl_clamped_and_non_negative():
    logp = torch.tensor([0.0, -50.0, -0.3])
    ref = torch.tensor([-100.0, 0.0, -0.1])
    out = kl_penalty(logp, ref, "low_var_kl")
    assert out[0] == 10.0 and out[1] == 10.0
    assert 0.0 <= float(out[2]) < 10.0


def test_unknown_kl_kind():
    with pytest.raises(ValueError, match="bogus"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "bogus")


# ---------- loss ----------

def _grad_of_loss(log_ratio, adv, **kw):
    old = torch.zeros(1, 1)
    logp = torch.tensor([[log_ratio]], requires_grad=True)
    loss, metrics = grpo_loss(logp, old, torch.tensor([adv]), torch.ones(1, 1), **kw)
    loss.backward()
    return float(loss.detach()), float(logp.grad), metrics


def test_clip_blocks_gradient_beyond_trust_region():
    ratio_hi, ratio_lo = math.log(1.5), math.log(0.5)
    # ratio above 1 + eps with positive advantage: clipped, constant loss, no gradient
    loss, grad, m = _grad_of_loss(ratio_hi, 1.0)
    assert loss == pytest.approx(-1.2) and grad == 0.0 and m["actor/clip_frac"] == 1.0
    # ratio below 1 - eps with negative advantage: clipped too
    loss, grad, m = _grad_of_loss(ratio_lo, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0 and m["actor/clip_frac"] == 1.0
    # the pessimistic side keeps the gradient: d(-A r)/dlogp = -A r
    loss, grad, m = _grad_of_loss(ratio_hi, -1.0)
    assert loss == pytest.approx(1.5) and grad == pytest.approx(1.5) and m["actor/clip_frac"] == 0.0
    loss, grad, m = _grad_of_loss(ratio_lo, 1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5) and m["actor/clip_frac"] == 0.0
    # inside the trust region the gradient is -A r
    loss, grad, _ = _grad_of_loss(math.log(1.1), 2.0)
    assert grad == pytest.approx(-2.2)


def _batch(seed=0, batch=6, length=7):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(batch, length, generator=g) * 2
    old = logp + 0.3 * torch.randn(batch, length, generator=g)
    ref = logp + 0.3 * torch.randn(batch, length, generator=g)
    ent = torch.rand(batch, length, generator=g)
    adv = torch.randn(batch, generator=g)
    lengths = torch.tensor([1, 7, 3, 5, 2, 6])[:batch]
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    return logp, old, ref, ent, adv, mask


def test_masked_token_mean_and_metrics():
    logp, old, _, ent, adv, mask = _batch()
    logp[mask == 0] = float("-inf")  # padding must not leak into the loss
    loss, m = grpo_loss(logp, old, adv, mask, entropy=ent)
    ratio = torch.exp(logp - old)
    a = adv[:, None]
    pg = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.2))
    expected = pg[mask.bool()].mean()
    assert torch.isfinite(loss) and torch.allclose(loss, expected)
    assert m["actor/pg_loss"] == pytest.approx(float(expected), rel=1e-5)
    assert m["actor/entropy"] == pytest.approx(float(ent[mask.bool()].mean()), rel=1e-5)
    assert m["actor/kl"] == 0.0
    assert 0.0 < m["actor/clip_frac"] < 1.0
    assert set(m) == {"actor/pg_loss", "actor/kl", "actor/clip_frac", "actor/clip_frac_low", "actor/clip_frac_high",
                      "actor/entropy"}
    assert all(isinstance(v, float) for v in m.values())


def test_kl_term_added():
    logp, old, ref, _, adv, mask = _batch(1)
    base, _ = grpo_loss(logp, old, adv, mask)
    with_kl, m = grpo_loss(logp, old, adv, mask, ref_log_probs=ref, kl_coef=0.1, kl_kind="mse")
    kl_mean = float((0.5 * (logp - ref) ** 2)[mask.bool()].mean())
    assert m["actor/kl"] == pytest.approx(kl_mean, rel=1e-5)
    assert float(with_kl - base) == pytest.approx(0.1 * kl_mean, rel=1e-4)
    with pytest.raises(ValueError):
        grpo_loss(logp, old, adv, mask, kl_coef=0.1)


def test_entropy_term_sign():
    logp, old, _, ent, adv, mask = _batch(2)
    ent = ent.clone().requires_grad_(True)
    base, _ = grpo_loss(logp, old, adv, mask, entropy=ent)
    bonus, _ = grpo_loss(logp, old, adv, mask, entropy=ent, entropy_coeff=0.01)
    mean_ent = ent[mask.bool()].mean()
    assert torch.allclose(bonus, base - 0.01 * mean_ent)
    bonus.backward()
    # minimising the loss pushes entropy up on response tokens and ignores padding
    assert (ent.grad[mask.bool()] < 0).all() and (ent.grad[~mask.bool()] == 0).all()
    with pytest.raises(ValueError):
        grpo_loss(logp, old, adv, mask, entropy_coeff=0.01)


def test_global_token_count_makes_split_equal_full_batch():
    logp0, old, ref, ent, adv, mask = _batch(3)
    kw = dict(ref_log_probs=ref, kl_coef=0.05, entropy=ent, entropy_coeff=0.01)

    full_lp = logp0.clone().requires_grad_(True)
    full, _ = grpo_loss(full_lp, old, adv, mask, **kw)
    full.backward()

    total = mask.sum()
    split_lp = logp0.clone().requires_grad_(True)
    pieces = []
    for rows in (slice(0, 2), slice(2, 6)):  # uneven token counts: 8 vs 16
        sub_kw = {k: (v[rows] if torch.is_tensor(v) else v) for k, v in kw.items()}
        piece, _ = grpo_loss(split_lp[rows], old[rows], adv[rows], mask[rows], token_count=total, **sub_kw)
        pieces.append(piece)
    summed = pieces[0] + pieces[1]
    summed.backward()
    assert torch.allclose(summed, full, atol=1e-6)
    assert torch.allclose(split_lp.grad, full_lp.grad, atol=1e-7)

    # per-piece normalisation would not match: the global count matters
    local = sum(grpo_loss(logp0[r], old[r], adv[r], mask[r])[0] for r in (slice(0, 2), slice(2, 6))) / 2
    assert not torch.allclose(local, full.detach(), atol=1e-4)


def test_on_policy_default_and_empty_mask():
    logp, _, _, _, adv, mask = _batch(4)
    lp = logp.clone().requires_grad_(True)
    loss, m = grpo_loss(lp, None, adv, mask)
    assert m["actor/clip_frac"] == 0.0
    # with ratio 1 the loss is -mean(A) over tokens
    assert torch.allclose(loss, -(adv[:, None] * mask).sum() / mask.sum())
    empty, m = grpo_loss(lp, None, adv, torch.zeros_like(mask))
    assert float(empty.detach()) == 0.0 and m["actor/pg_loss"] == 0.0
    with pytest.raises(ValueError):
        grpo_loss(lp, None, adv, mask, token_count=0)
