"""RLOO against a leave-one-out loop."""
import pytest

from mindspeed_rl.algorithms import get_adv_estimator_fn
from mindspeed_rl.algorithms.spec import AdvantageSpec

from .conftest import LENGTHS, N, SCORES


def test_each_row_less_the_mean_of_the_others(batch):
    rewards, mask = batch
    adv, _ = get_adv_estimator_fn("rloo")(rewards, mask, N, AdvantageSpec())
    for row, s in enumerate(SCORES):
        g = row // N
        others = [SCORES[k] for k in range(g * N, (g + 1) * N) if k != row]
        want = s - sum(others) / len(others)
        assert adv[row, :LENGTHS[row]].tolist() == pytest.approx([want] * LENGTHS[row])
        assert adv[row, LENGTHS[row]:].abs().sum() == 0


def test_a_group_of_one_keeps_its_score(batch):
    rewards, mask = batch
    adv, _ = get_adv_estimator_fn("rloo")(rewards, mask, 1, AdvantageSpec())
    assert [float(adv[i, 0]) for i in range(6)] == pytest.approx(SCORES)
