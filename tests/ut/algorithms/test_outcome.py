"""Outcome scores per group: the shape checks name what they got; padding never adds to a row's score."""
import pytest
import torch

from mindspeed_rl.algorithms.outcome import group_scores, per_token

from .conftest import LENGTHS, SCORES, mask_of, outcome_rewards


def test_scores_are_summed_over_each_rows_response_tokens_in_groups():
    rewards = outcome_rewards()
    rewards[0, 0] = 0.5  # a reward before the last token counts too
    noisy = torch.where(mask_of(LENGTHS), rewards, torch.full_like(rewards, 9.0))
    got = group_scores(noisy, mask_of(LENGTHS), 3)
    want = [s + (0.5 if i == 0 else 0.0) for i, s in enumerate(SCORES)]
    assert got.shape == (2, 3) and got.reshape(-1).tolist() == pytest.approx(want)
    wide = group_scores(outcome_rewards(width=5), mask_of(LENGTHS, width=5), 2)  # the sum runs over tokens
    assert wide.shape == (3, 2) and wide.reshape(-1).tolist() == pytest.approx(SCORES)


def test_bad_shapes_are_refused_by_name():
    with pytest.raises(ValueError, match="^n_samples must be >= 1, got 0$"):
        group_scores(outcome_rewards(), mask_of(LENGTHS), 0)
    with pytest.raises(ValueError, match=r"^token_level_rewards \(6, 4\) and response_mask \(6, 5\) must be the same "
                                         r"\(rows, tokens\) shape$"):
        group_scores(outcome_rewards(), mask_of(LENGTHS, width=5), 3)
    with pytest.raises(ValueError, match=r"^token_level_rewards \(24,\) and response_mask \(24,\) must be the same"):
        group_scores(outcome_rewards().reshape(-1), mask_of(LENGTHS).reshape(-1), 3)
    with pytest.raises(ValueError, match="^6 rows do not split into groups of 4$"):
        group_scores(outcome_rewards(), mask_of(LENGTHS), 4)


def test_per_token_puts_each_rows_value_on_its_tokens_only():
    got = per_token(torch.tensor([1.0, -2.0]), mask_of([2, 3]))
    assert got.tolist() == [[1.0, 1.0, 0.0, 0.0], [-2.0, -2.0, -2.0, 0.0]]
