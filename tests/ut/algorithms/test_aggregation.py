"""loss_agg_mode against loops over rows; pieces with the whole batch's denominator add up to the whole."""
import pytest
import torch

from mindspeed_rl.algorithms.aggregation import agg_loss, denominator

from .conftest import LENGTHS, mask_of

LOSS = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 7 - 1


def reference(mode, horizon=4):
    rows = [LOSS[i, :n].tolist() for i, n in enumerate(LENGTHS)]
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(LENGTHS)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    if mode == "seq-mean-token-sum":
        return sum(sum(r) for r in rows) / len(rows)
    return sum(sum(r) for r in rows) / (len(rows) * horizon)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_each_mode_matches_its_loop_and_splits_into_pieces(mode):
    mask = mask_of(LENGTHS)
    assert float(agg_loss(LOSS, mask, mode, horizon=4)) == pytest.approx(reference(mode))
    denom = denominator(LENGTHS, mode, 10.0)
    whole = agg_loss(LOSS, mask, mode, denom)
    parts = agg_loss(LOSS[:2], mask[:2], mode, denom) + agg_loss(LOSS[2:], mask[2:], mode, denom)
    assert float(parts) == pytest.approx(float(whole))
    if mode == "seq-mean-token-sum-norm":  # Dr.GRPO: a fixed horizon, not the batch's longest row
        assert float(whole) == pytest.approx(reference(mode, 10.0))


def test_denominators_and_bad_modes():
    assert denominator([3, 0, 2], "token-mean") == 5
    assert denominator([3, 0, 2], "seq-mean-token-mean") == 2  # a row with no kept token is not counted
    assert denominator([3, 0, 2], "seq-mean-token-sum-norm", 8) == 16
    with pytest.raises(ValueError, match="needs a positive horizon"):
        denominator([1], "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"rl_config.loss_agg_mode='mean' is not one of"):
        denominator([1], "mean")


def test_the_horizon_defaults_to_the_batch_width_and_a_given_one_wins():
    mask = mask_of(LENGTHS, width=5)  # 6 rows of 5 tokens: the width, not the row count
    loss = torch.ones(6, 5)
    total = float(sum(LENGTHS))
    assert float(agg_loss(loss, mask, "seq-mean-token-sum-norm")) == pytest.approx(total / (6 * 5))
    assert float(agg_loss(loss, mask, "seq-mean-token-sum-norm", horizon=10)) == pytest.approx(total / (6 * 10))
    assert denominator([2], "seq-mean-token-sum-norm", 1) == 1.0  # a horizon of one token is a horizon
    with pytest.raises(ValueError, match="needs a positive horizon, got 0"):
        denominator([2], "seq-mean-token-sum-norm", 0)


def test_a_non_positive_denominator_is_refused_as_a_number_or_a_tensor():
    for bad in (0, -1.0, torch.tensor(0.0)):
        with pytest.raises(ValueError, match="token_count must be positive"):
            agg_loss(LOSS, mask_of(LENGTHS), "token-mean", bad)
    assert float(agg_loss(LOSS, mask_of(LENGTHS), "token-mean", torch.tensor(2.0))) == \
        pytest.approx(float(agg_loss(LOSS, mask_of(LENGTHS), "token-mean", 2.0)))
