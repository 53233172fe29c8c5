"""PPO advantage math: token-level rewards with KL, GAE against a per-row reference, masking, whitening."""
import pytest
import torch

from mindspeed_rl.models.loss.grpo_loss import kl_penalty
from mindspeed_rl.data.columnar import unpadded_rows
from mindspeed_rl.trainer.utils.advantages import (
    compute_gae_advantage_return,
    kl_in_reward,
    masked_mean,
    masked_var,
    masked_whiten,
    pad_rows,
    token_level_rewards,
)

LENGTHS = [4, 1, 6, 3]


def _rows(seed, lengths=LENGTHS):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for n in lengths]


def _reference_gae(rewards, values, gamma, lam):
    """Plain per-row GAE, written from the definition (python floats, no masks)."""
    adv, returns = [], []
    for r, v in zip(rewards, values):
        n = len(r)
        a = [0.0] * n
        running = 0.0
        for t in reversed(range(n)):
            nxt = float(v[t + 1]) if t + 1 < n else 0.0
            delta = float(r[t]) + gamma * nxt - float(v[t])
            running = delta + gamma * lam * running
            a[t] = running
        adv.append(torch.tensor(a))
        returns.append(torch.tensor(a) + v)
    return adv, returns


def _whiten_reference(rows):
    flat = torch.cat(rows)
    mean, var = flat.mean(), flat.var()  # unbiased, over every real token of the batch
    return [(r - mean) / torch.sqrt(var + 1e-8) for r in rows]


def test_pad_and_unpad_round_trip():
    rows = _rows(0, [3, 0, 2])
    padded, mask = pad_rows(rows)
    assert padded.shape == (3, 3) and mask.dtype == torch.bool
    assert mask.sum(dim=1).tolist() == [3, 0, 2]
    assert torch.equal(padded[2, 2:], torch.zeros(1))
    flat, lengths, trailing = unpadded_rows(padded, [3, 0, 2])  # the way back: one flat buffer
    assert torch.equal(flat, torch.cat(rows)) and lengths.tolist() == [3, 0, 2] and trailing == ()
    with pytest.raises(ValueError, match="2 lengths for 3 rows"):
        unpadded_rows(padded, [1, 2])


def test_masked_stats_ignore_padding():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, float("nan"), float("inf")]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(masked_mean(x, mask)) == pytest.approx(2.0)
    assert masked_mean(x, mask, dim=1).tolist() == pytest.approx([1.5, 3.0])
    assert float(masked_var(x, mask)) == pytest.approx(torch.tensor([1.0, 2.0, 3.0]).var().item())
    assert float(masked_var(x, mask, unbiased=False)) == pytest.approx(2.0 / 3.0)
    assert float(masked_mean(x, torch.zeros_like(mask))) == 0.0


def test_masked_whiten_statistics():
    rows = [r * 3.0 + 5.0 for r in _rows(1)]
    padded, mask = pad_rows(rows, pad_value=1e6)  # huge padding must not move the stats
    white = masked_whiten(padded, mask)
    real = white[mask]
    assert float(real.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(real.std()) == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(white[~mask], torch.zeros(int((~mask).sum())))
    # without the shift only the scale changes: the mean stays
    kept = masked_whiten(padded, mask, shift_mean=False)[mask]
    assert float(kept.mean()) == pytest.approx(float(torch.cat(rows).mean()), abs=1e-5)


def test_token_level_rewards_score_on_last_token_minus_kl():
    scores = torch.tensor([1.0, -2.0, 0.5, 3.0])
    lengths = [3, 1, 0, 2]
    kl = [torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0.4]), torch.zeros(0), torch.tensor([-0.5, 0.6])]
    rewards, mask = token_level_rewards(scores, lengths)
    assert rewards.shape == (4, 3)
    expected = torch.tensor([[0, 0, 1.0], [-2.0, 0, 0], [0, 0, 0], [0, 3.0, 0]])
    assert torch.equal(rewards, expected)
    assert mask.sum(dim=1).tolist() == lengths
    with_kl, _ = token_level_rewards(scores, torch.tensor(lengths), kl=kl, kl_coef=0.5)
    kl_pad, _ = pad_rows(kl)
    torch.testing.assert_close(with_kl, expected - 0.5 * kl_pad)
    # a padded kl whose padding holds garbage: only masked tokens are charged
    garbage = kl_pad.clone()
    garbage[~mask] = 7.0
    torch.testing.assert_close(token_level_rewards(scores, lengths, kl=garbage, kl_coef=0.5)[0], with_kl)


def test_kl_in_reward_kinds_and_mask():
    old, ref = _rows(2), _rows(3)
    for kind in ("kl", "abs", "mse", "low_var_kl"):
        got = kl_in_reward(old, ref, kind)
        for g, o, r in zip(got, old, ref):
            torch.testing.assert_close(g, kl_penalty(o, r, kind))
    old_p, mask = pad_rows(old)
    ref_p, _ = pad_rows(ref)
    ref_p[~mask] = 50.0
    kl = kl_in_reward(old_p, ref_p, "low_var_kl", mask)
    assert torch.equal(kl[~mask], torch.zeros(int((~mask).sum())))
    for row, n, expected in zip(kl, LENGTHS, kl_in_reward(old, ref, "low_var_kl")):
        torch.testing.assert_close(row[:n], expected)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_matches_reference(gamma, lam):
    rewards, values = _rows(4), _rows(5)
    ref_adv, ref_ret = _reference_gae(rewards, values, gamma, lam)
    r_pad, mask = pad_rows(rewards)
    v_pad, _ = pad_rows(values)
    adv, ret = compute_gae_advantage_return(r_pad, v_pad, mask, gamma, lam)
    assert adv.shape == ret.shape == r_pad.shape
    for row, n, a, rt in zip(range(len(LENGTHS)), LENGTHS, _whiten_reference(ref_adv), ref_ret):
        torch.testing.assert_close(adv[row, :n], a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ret[row, :n], rt, atol=1e-5, rtol=1e-5)
    assert torch.equal(adv[~mask], torch.zeros(int((~mask).sum())))
    assert torch.equal(ret[~mask], torch.zeros(int((~mask).sum())))
    # lists of rows give the same
    adv_l, ret_l = compute_gae_advantage_return(rewards, values, None, gamma, lam)
    torch.testing.assert_close(adv_l, adv)
    torch.testing.assert_close(ret_l, ret)


def test_gamma_lam_one_returns_are_the_score():
    """With gamma = lam = 1 and the score on the last token, A_t = score - V_t and every return is the score."""
    scores = torch.tensor([1.0, -0.5, 2.0, 0.0])
    rewards, mask = token_level_rewards(scores, LENGTHS)
    values, _ = pad_rows(_rows(6))
    adv, ret = compute_gae_advantage_return(rewards, values, mask, 1.0, 1.0)
    raw = ret - values  # returns = advantages before whitening + values
    for row, n in enumerate(LENGTHS):
        torch.testing.assert_close(raw[row, :n], scores[row] - values[row, :n])
        torch.testing.assert_close(ret[row, :n], scores[row].expand(n))
    white = _whiten_reference([scores[i] - values[i, :n] for i, n in enumerate(LENGTHS)])
    for row, n in enumerate(LENGTHS):
        torch.testing.assert_close(adv[row, :n], white[row], atol=1e-5, rtol=1e-5)


def test_padding_does_not_leak():
    rewards, mask = pad_rows(_rows(7))
    values, _ = pad_rows(_rows(8))
    adv, ret = compute_gae_advantage_return(rewards, values, mask, 0.99, 0.95)
    noisy_r, noisy_v = rewards.clone(), values.clone()
    noisy_r[~mask] = 123.0
    noisy_v[~mask] = -55.0
    adv2, ret2 = compute_gae_advantage_return(noisy_r, noisy_v, mask, 0.99, 0.95)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    # a wider padding (more columns) changes nothing either
    wide_r = torch.cat([rewards, torch.full((4, 3), 9.0)], dim=1)
    wide_v = torch.cat([values, torch.full((4, 3), 9.0)], dim=1)
    wide_m = torch.cat([mask, torch.zeros(4, 3, dtype=torch.bool)], dim=1)
    adv3, ret3 = compute_gae_advantage_return(wide_r, wide_v, wide_m, 0.99, 0.95)
    torch.testing.assert_close(adv3[:, :mask.shape[1]], adv)
    torch.testing.assert_close(ret3[:, :mask.shape[1]], ret)


def test_masked_hole_is_skipped():
    """A token outside the mask inside a row is passed over: its neighbours link up directly."""
    rewards = torch.tensor([[0.3, 5.0, -0.2, 1.0]])
    values = torch.tensor([[0.1, 9.0, 0.4, 0.2]])
    mask = torch.tensor([[1, 0, 1, 1]])
    _, ret = compute_gae_advantage_return(rewards, values, mask, 0.9, 0.8)
    _, ret_ref = compute_gae_advantage_return(rewards[:, [0, 2, 3]], values[:, [0, 2, 3]],
                                              torch.ones(1, 3), 0.9, 0.8)
    torch.testing.assert_close(ret[0, [0, 2, 3]], ret_ref[0])
    assert float(ret[0, 1]) == 0.0


def test_shape_mismatch_is_refused():
    with pytest.raises(ValueError):
        compute_gae_advantage_return(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0)
    with pytest.raises(ValueError):
        token_level_rewards(torch.zeros(3), [1, 2])
