"""REINFORCE++ and its baseline variant against loops: discounted returns, group baseline, batch whitening."""
import pytest
import torch

from mindspeed_rl.algorithms import get_adv_estimator_fn
from mindspeed_rl.algorithms.spec import AdvantageSpec

from .conftest import LENGTHS, N, SCORES, mask_of, outcome_rewards, py_mean, py_whiten


def test_discounted_returns_whitened_over_the_batch(batch):
    rewards, mask = batch
    rewards = rewards.clone()
    rewards[0, 1] = 0.25  # a reward before the last token: the discount shows
    gamma = 0.9
    adv, returns = get_adv_estimator_fn("reinforce_plus_plus")(rewards, mask, N, AdvantageSpec(gamma=gamma))
    want_returns = []
    for i, n in enumerate(LENGTHS):
        row = [0.0] * 4
        running = 0.0
        for t in reversed(range(n)):
            running = float(rewards[i, t]) + gamma * running
            row[t] = running
        want_returns.append(row)
    assert returns.tolist() == [pytest.approx(r) for r in want_returns]
    want = py_whiten(want_returns, LENGTHS)
    assert adv.tolist() == [pytest.approx(r, abs=1e-5) for r in want]


def test_baseline_takes_the_group_mean_off_then_whitens(batch):
    rewards, mask = batch
    adv, _ = get_adv_estimator_fn("reinforce_plus_plus_baseline")(rewards, mask, N, AdvantageSpec())
    centred = [[s - py_mean(SCORES[(i // N) * N:(i // N + 1) * N])] * 4 for i, s in enumerate(SCORES)]
    want = py_whiten(centred, LENGTHS)
    assert adv.tolist() == [pytest.approx(r, abs=1e-5) for r in want]
    assert float(adv[mask].mean()) == pytest.approx(0.0, abs=1e-6)


def test_padding_never_counts(batch):
    rewards, mask = batch
    noisy = torch.where(mask, rewards, torch.full_like(rewards, 99.0))
    for name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        clean, _ = get_adv_estimator_fn(name)(rewards, mask, N, AdvantageSpec())
        dirty, _ = get_adv_estimator_fn(name)(noisy, mask, N, AdvantageSpec())
        assert torch.allclose(clean, dirty)


def test_baseline_takes_no_mean_from_a_group_of_one_and_does_from_a_group_of_two():
    rewards, mask = outcome_rewards(), mask_of(LENGTHS)
    alone, _ = get_adv_estimator_fn("reinforce_plus_plus_baseline")(rewards, mask, 1, AdvantageSpec())
    want = py_whiten([[s] * 4 for s in SCORES], LENGTHS)  # the scores themselves, whitened
    assert alone.tolist() == [pytest.approx(r, abs=1e-5) for r in want]
    pairs, _ = get_adv_estimator_fn("reinforce_plus_plus_baseline")(rewards, mask, 2, AdvantageSpec())
    centred = [[s - py_mean(SCORES[i // 2 * 2:i // 2 * 2 + 2])] * 4 for i, s in enumerate(SCORES)]
    assert pairs.tolist() == [pytest.approx(r, abs=1e-5) for r in py_whiten(centred, LENGTHS)]


def test_gae_without_values_is_refused_by_name(batch):
    rewards, mask = batch
    with pytest.raises(ValueError, match="^adv_estimator 'gae' needs the critic's values$"):
        get_adv_estimator_fn("gae")(rewards, mask, N, AdvantageSpec())
