"""GRPO and Dr.GRPO (norm_adv_by_std_in_grpo=false) against per-group loops."""
import pytest
import torch

from mindspeed_rl.algorithms import get_adv_estimator_fn
from mindspeed_rl.algorithms.spec import AdvantageSpec

from .conftest import LENGTHS, N, SCORES, py_mean, py_std


@pytest.mark.parametrize("by_std", [True, False])
def test_group_norm_matches_the_loop_on_every_token(batch, by_std):
    rewards, mask = batch
    adv, returns = get_adv_estimator_fn("grpo")(rewards, mask, N, AdvantageSpec(norm_adv_by_std_in_grpo=by_std))
    for g in range(2):
        group = SCORES[g * N:(g + 1) * N]
        for j, s in enumerate(group):
            want = (s - py_mean(group)) / ((py_std(group) + 1e-6) if by_std else 1.0)
            row = g * N + j
            assert adv[row, :LENGTHS[row]].tolist() == pytest.approx([want] * LENGTHS[row], rel=1e-5)
            assert adv[row, LENGTHS[row]:].abs().sum() == 0  # padding stays 0
    assert torch.equal(adv, returns)


def test_one_sample_per_group_gives_zero(batch):
    rewards, mask = batch
    adv, _ = get_adv_estimator_fn("group_norm")(rewards, mask, 1, AdvantageSpec())
    assert adv.abs().sum() == 0


def test_rows_that_do_not_split_into_groups_are_refused(batch):
    rewards, mask = batch
    with pytest.raises(ValueError, match="6 rows do not split into groups of 4"):
        get_adv_estimator_fn("grpo")(rewards, mask, 4, AdvantageSpec())


def test_row_level_function_refuses_bad_inputs_by_name_and_adds_eps_to_the_std():
    from mindspeed_rl.algorithms.grpo import compute_group_norm_advantages
    with pytest.raises(ValueError, match="^n_samples must be >= 1, got 0$"):
        compute_group_norm_advantages(torch.zeros(4), 0)
    with pytest.raises(ValueError, match=r"^rewards must be 1-D, got shape \(2, 2\)$"):
        compute_group_norm_advantages(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="^5 rewards do not split into groups of 2$"):
        compute_group_norm_advantages(torch.zeros(5), 2)
    tiny = torch.tensor([0.0, 2e-6])  # std 1.41e-6: the eps of 1e-6 is a visible part of the divisor
    adv = compute_group_norm_advantages(tiny, 2, eps=1e-6)
    assert adv.tolist() == pytest.approx([-1e-6 / (2 ** 0.5 * 1e-6 + 1e-6), 1e-6 / (2 ** 0.5 * 1e-6 + 1e-6)])
