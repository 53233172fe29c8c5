"""Rollout correction at its edges: the +-20 clamp on both sides, bounds that are met exactly, one real token,
no real token at all, rows of different lengths for the per-row statistics, and the shape and name checks."""
import math

import pytest
import torch

from mindspeed_rl.plan.rollout_correction import CorrectionSpec
from mindspeed_rl.models.loss.rollout_correction import RejectRule, correct, is_weights, reject_keep

ONE = torch.ones(1, 2)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_log_ratios_beyond_20_are_clamped_on_both_sides():
    lr = _t([[30.0, -30.0]])
    _, raw = is_weights(lr, ONE, "token", upper=1e12)
    assert raw[0].tolist() == pytest.approx([math.exp(20), math.exp(-20)])
    _, raw = is_weights(_t([[15.0, 15.0]]), ONE, "sequence", upper=1e12)
    assert raw[0, 0].item() == pytest.approx(math.exp(20))
    _, raw = is_weights(_t([[-15.0, -15.0]]), ONE, "sequence", upper=1e12)
    assert raw[0, 0].item() == pytest.approx(math.exp(-20))
    # k2 of a clamped ratio is 200 either side, under a threshold of 300; unclamped it would be 450
    keep = reject_keep(lr, ONE, [RejectRule("token_k2", 300.0)])
    assert keep.tolist() == [[True, True]]


def test_bounds_met_exactly_are_inside():
    zero = _t([[0.0, 0.0]])  # ratio 1 exactly
    w, _ = is_weights(zero, ONE, "token", upper=2.0, lower=1.0)
    assert w.tolist() == [[1.0, 1.0]]
    w, _ = is_weights(zero, ONE, "token", upper=1.0, lower=0.5)
    assert w.tolist() == [[1.0, 1.0]]
    assert reject_keep(zero, ONE, [RejectRule("token_k1", 1.0, 1.0)]).tolist() == [[True, True]]
    half = _t([[1.0, -1.0]])  # k2 = 0.5 exactly
    assert reject_keep(half, ONE, [RejectRule("token_k2", 0.5)]).tolist() == [[True, True]]
    _, _, metrics = correct(zero, torch.zeros(1, 2, dtype=torch.float64), ONE, CorrectionSpec("token", 1.0, 1.0))
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == 0.0


def test_icepop_through_correct_zeroes_and_counts_the_low_side():
    old, roll = _t([[0.0, -1.0, 1.0, 0.1]]), torch.zeros(1, 4, dtype=torch.float64)
    mask = torch.ones(1, 4)
    weights, _, metrics = correct(old, roll, mask, CorrectionSpec("token", 1.5, 0.8))
    assert weights[0].tolist() == pytest.approx([1.0, 0.0, 0.0, math.exp(0.1)])
    assert metrics["rollout_corr/rollout_is_ratio_fraction_low"] == pytest.approx(1 / 4)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 4)
    assert metrics["rollout_corr/rollout_is_min"] == 0.0


def test_per_row_means_use_each_rows_own_token_count():
    # row 0: one token with k2 = 0.5; row 1: three tokens with k2 = 0. Row 0's mean is 0.5 (not 0.5 / 4)
    lr = _t([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    keep = reject_keep(lr, mask, [RejectRule("seq_mean_k2", 0.3)])
    assert keep.tolist() == [[False, False, False], [True, True, True]]


def test_rejected_rows_are_counted_once_and_fractions_divide_by_real_tokens():
    lr = _t([[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]])  # two rejected tokens, both in row 0
    spec = CorrectionSpec(None, rules=(RejectRule("token_k2", 1.0),))
    _, keep, metrics = correct(lr, torch.zeros_like(lr), torch.ones(2, 3), spec)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 6)
    one = _t([[2.0]])  # a single real token, rejected: fractions of 1, not of 2
    _, _, metrics = correct(one, torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1), spec)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0
    _, _, metrics = correct(_t([[0.5]]), torch.zeros(1, 1, dtype=torch.float64), torch.ones(1, 1),
                            CorrectionSpec("token", 2.0))
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(math.exp(0.5))


def test_a_batch_without_real_tokens_reports_zeros():
    none = torch.zeros(1, 2)
    weights, keep, metrics = correct(_t([[1.0, 1.0]]), torch.zeros(1, 2, dtype=torch.float64), none,
                                     CorrectionSpec("token", 2.0, None, (RejectRule("token_k2", 0.1),)))
    assert weights.abs().sum() == 0 and not keep.any()
    assert (metrics["rollout_corr/rollout_is_max"], metrics["rollout_corr/rollout_is_min"],
            metrics["rollout_corr/rollout_is_mean"], metrics["rollout_corr/rollout_rs_seq_masked_fraction"]) == (
        0.0, 0.0, 0.0, 0.0)


def test_shapes_and_names_are_checked():
    with pytest.raises(ValueError, match="rollout log-probs \\(2, 4\\)"):
        correct(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), CorrectionSpec("token"))
    with pytest.raises(ValueError, match="^rollout_is must be 'token' or 'sequence', got 'row'$"):
        is_weights(torch.zeros(1, 1), torch.ones(1, 1), "row", 2.0)
    with pytest.raises(ValueError, match="^rollout_rs option 'seq_foo_k2' is not one of \\['token_k1'"):
        reject_keep(torch.zeros(1, 1), torch.ones(1, 1), [RejectRule("seq_foo_k2", 1.0)])
