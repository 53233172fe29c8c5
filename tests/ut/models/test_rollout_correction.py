"""Rollout correction: weights and masks against a reference written with plain Python loops over hand-made
log-probs, and the config keys' checks."""
import math

import pytest
import torch

from mindspeed_rl.plan.rollout_correction import CorrectionSpec, correction_spec
from mindspeed_rl.models.loss.rollout_correction import RejectRule, correct, is_weights, reject_keep

# two rows: 4 real tokens, then 2 real tokens and 2 padded
OLD = [[-0.5, -1.0, -0.2, -3.0], [-0.1, -2.0, 0.0, 0.0]]
ROLL = [[-0.9, -0.4, -0.2, -5.9], [-0.3, -1.5, 0.0, 0.0]]
LENGTHS = [4, 2]


def _tensors():
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in LENGTHS])
    # padded positions hold junk the functions must ignore
    old = torch.tensor(OLD, dtype=torch.float64)
    old[1, 2:] = 30.0
    return old, torch.tensor(ROLL, dtype=torch.float64), mask


def _ratios(row):
    return [OLD[row][t] - ROLL[row][t] for t in range(LENGTHS[row])]


def test_token_weights_truncate_at_the_upper_bound():
    old, roll, mask = _tensors()
    weights, raw = is_weights(old - roll, mask, "token", upper=1.5)
    for row in range(2):
        for t in range(4):
            want_raw = math.exp(_ratios(row)[t]) if t < LENGTHS[row] else 0.0
            assert raw[row, t].item() == pytest.approx(want_raw)
            assert weights[row, t].item() == pytest.approx(min(want_raw, 1.5))
    assert weights[0, 3].item() == pytest.approx(1.5)  # exp(2.9) truncated


def test_sequence_weights_are_one_product_per_row():
    old, roll, mask = _tensors()
    weights, _ = is_weights(old - roll, mask, "sequence", upper=100.0)
    for row in range(2):
        product = math.exp(sum(_ratios(row)))
        for t in range(4):
            assert weights[row, t].item() == pytest.approx(min(product, 100.0) if t < LENGTHS[row] else 0.0)


def test_icepop_bounds_zero_the_weights_outside():
    old, roll, mask = _tensors()
    weights, _ = is_weights(old - roll, mask, "token", upper=1.2, lower=0.8)
    for row in range(2):
        for t, r in enumerate(_ratios(row)):
            w = math.exp(r)
            assert weights[row, t].item() == pytest.approx(w if 0.8 <= w <= 1.2 else 0.0)


def _k(kind, r):
    return {"k1": -r, "k2": 0.5 * r * r, "k3": math.exp(r) - 1 - r}[kind]


@pytest.mark.parametrize("option,upper,lower", [
    ("token_k1", 1.5, 1 / 1.5), ("token_k2", 0.1, None), ("token_k3", 0.05, None),
    ("seq_sum_k1", 2.0, 0.5), ("seq_sum_k3", 0.3, None), ("seq_mean_k2", 0.5, None),
    ("seq_mean_k1", 1.3, 0.2), ("seq_max_k2", 0.2, None), ("seq_max_k3", 5.0, None)])
def test_rejection_rules_against_a_loop(option, upper, lower):
    old, roll, mask = _tensors()
    keep = reject_keep(old - roll, mask, [RejectRule(option, upper, lower)])
    scope, kind = option.rsplit("_", 1)
    for row in range(2):
        stats = [_k(kind, r) for r in _ratios(row)]
        if scope == "token":
            values = stats
        else:
            value = {"seq_sum": sum(stats), "seq_mean": sum(stats) / len(stats), "seq_max": max(stats)}[scope]
            values = [value] * len(stats)
        for t in range(4):
            if t >= LENGTHS[row]:
                assert not keep[row, t]
                continue
            v = values[t]
            passed = (math.log(lower) <= v <= math.log(upper)) if kind == "k1" else v <= upper
            assert bool(keep[row, t]) == passed, (row, t, v)


def test_rules_combine_and_metrics_count_rejections():
    old, roll, mask = _tensors()
    spec = CorrectionSpec("token", 2.0, None, (RejectRule("token_k2", 0.1), RejectRule("seq_max_k3", 100.0)))
    weights, keep, metrics = correct(old, roll, mask, spec)
    # token_k2 <= 0.1 keeps |r| <= sqrt(0.2): row 0 tokens 0 (0.4), 2 (0.0); row 1 tokens 0 (0.2)
    want = [[True, False, True, False], [True, False, False, False]]
    assert keep.tolist() == want
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 6)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)
    real = [math.exp(r) for row in range(2) for r in _ratios(row)]
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(sum(min(w, 2.0) for w in real) / 6)
    assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(2.0)
    assert metrics["rollout_corr/rollout_is_min"] == pytest.approx(min(real))
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(sum(w > 2.0 for w in real) / 6)
    assert weights.dtype == torch.float32 and weights[1, 2:].abs().sum() == 0


def test_without_weights_every_real_token_weighs_one():
    old, roll, mask = _tensors()
    weights, keep, metrics = correct(old, roll, mask, CorrectionSpec(None))
    assert weights.tolist() == mask.tolist() and keep.tolist() == (mask > 0).tolist()
    assert "rollout_corr/rollout_is_mean" not in metrics


def test_shapes_must_agree():
    old, roll, mask = _tensors()
    with pytest.raises(ValueError, match="one shape"):
        correct(old[:, :3], roll, mask, CorrectionSpec("token"))


# ------------------------------------------------------------ config keys

def test_partial_rollout_turns_token_weights_on_by_default():
    assert correction_spec(None, partial=True) == CorrectionSpec("token", 2.0)
    assert not correction_spec(None, partial=False).on
    assert not correction_spec({"rollout_is": None}, partial=True).on


def test_keys_parse_as_verl_reads_them():
    spec = correction_spec({"rollout_is": "sequence", "rollout_is_threshold": "0.5_3", "rollout_rs":
                            "token_k1,seq_mean_k3", "rollout_rs_threshold": "2,0.01"}, partial=False)
    assert (spec.rollout_is, spec.is_lower, spec.is_upper) == ("sequence", 0.5, 3.0)
    assert spec.rules == (RejectRule("token_k1", 2.0, 0.5), RejectRule("seq_mean_k3", 0.01))
    assert correction_spec({"bypass_mode": True}, partial=True) == CorrectionSpec(None, bypass_mode=True)
    assert "bypass mode" in correction_spec({"bypass_mode": True}, partial=False).describe()


@pytest.mark.parametrize("raw,match", [
    ({"rollout_is": "row"}, "rollout_is='row'"),
    ({"rollout_is_threshold": 0}, "positive"),
    ({"rollout_is_threshold": "3_1"}, "lower bound exceeds"),
    ({"rollout_is_threshold": 0.52}, "=0.52 would truncate every weight below 1; .* quoted, e.g. '0.5_2'"),
    ({"rollout_rs": "token_k9", "rollout_rs_threshold": 1}, "token_k9"),
    ({"rollout_rs": "token_k2"}, "needs rollout_rs_threshold"),
    ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_0.2"}, "not a number"),
    ({"rollout_rs": "token_k2,seq_sum_k3", "rollout_rs_threshold": "1,2,3"}, "3 thresholds for 2"),
    ({"loss_type": "reinforce"}, "only 'ppo_clip'"),
    ({"rollout_is_batch_normalize": True}, "not implemented"),
    ({"bypass_mode": "yes"}, "true or false"),
    ({"bypass_mode": True, "rollout_rs": "token_k2", "rollout_rs_threshold": 1}, "bypass_mode=true"),
    ({"rollout_iss": "token"}, "rollout_iss is not"),
    ("token", "must be a mapping"),
])
def test_bad_keys_are_named(raw, match):
    with pytest.raises(ValueError, match=match):
        correction_spec(raw, partial=False)
