"""grpo_loss's switches with hand values: the loss normalisation (token_level_loss), DAPO's clip-higher
bounds and their metrics, the KL and entropy coefficients, dtypes, and what padding may hold."""
import math

import pytest
import torch

from mindspeed_rl.models.loss.grpo_loss import compute_group_norm_advantages, grpo_loss, kl_penalty

# two rows: 1 and 3 real tokens, advantages 1 and 2, on-policy (ratio 1): per token -A
LP = torch.zeros(2, 3)
MASK = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
ADV = torch.tensor([1.0, 2.0])


def test_token_level_loss_weighs_every_token_the_same():
    loss, _ = grpo_loss(LP, None, ADV, MASK)
    assert float(loss) == pytest.approx(-(1 * 1 + 2 * 3) / 4)


def test_sequence_level_loss_weighs_every_sequence_the_same():
    loss, _ = grpo_loss(LP, None, ADV, MASK, token_level_loss=False)
    assert float(loss) == pytest.approx(-(1 + 2) / 2)
    # token_count counts sequences here: the whole mini-batch's (e.g. 4 over all ranks)
    loss, _ = grpo_loss(LP, None, ADV, MASK, token_level_loss=False, token_count=4)
    assert float(loss) == pytest.approx(-(1 + 2) / 4)


def test_sequence_level_loss_skips_empty_rows():
    mask = torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, 5.0, 2.0])
    loss, _ = grpo_loss(torch.zeros(3, 3), None, adv, mask, token_level_loss=False)
    assert float(loss) == pytest.approx(-(1 + 2) / 2)  # two non-empty rows
    loss, _ = grpo_loss(torch.zeros(3, 3), None, adv, torch.zeros(3, 3), token_level_loss=False)
    assert float(loss) == 0.0


def test_sequence_level_loss_gradient_is_per_sequence_mean():
    lp = torch.zeros(2, 3, requires_grad=True)
    loss, _ = grpo_loss(lp, None, ADV, MASK, token_level_loss=False)
    loss.backward()
    # d/dlogp of -A * r / n_tokens(row) / n_rows, r = exp(logp - old) = 1
    want = torch.tensor([[-1.0 / 2, 0, 0], [-2.0 / 3 / 2] * 3])
    assert torch.allclose(lp.grad, want)


def test_per_token_advantages_are_used_as_given():
    adv = torch.tensor([[1.0, 9.0, 9.0], [1.0, 2.0, 3.0]])
    loss, _ = grpo_loss(LP, None, adv, MASK)
    assert float(loss) == pytest.approx(-(1 + 1 + 2 + 3) / 4)


def _ratios(values):
    """log-probs whose ratio to old log-probs 0 are ``values``."""
    return torch.log(torch.tensor([values]))


def test_clip_higher_bounds_and_metrics():
    """ratio 0.7, 0.9, 1.1, 1.4 with low 0.2 and high 0.3: 0.7 is below 1 - low, 1.4 above 1 + high."""
    lp = _ratios([0.7, 0.9, 1.1, 1.4])
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    for adv, clipped_at in ((1.0, "high"), (-1.0, "low")):
        advantages = torch.tensor([adv])
        loss, m = grpo_loss(lp, old, advantages, mask, clip_ratio=0.5, clip_ratio_low=0.2, clip_ratio_high=0.3)
        if adv > 0:  # max(-A r, -A clip(r)): only r = 1.4 is clipped (to 1.3)
            want = -(0.7 + 0.9 + 1.1 + 1.3) / 4
        else:  # only r = 0.7 is clipped (to 0.8)
            want = (0.8 + 0.9 + 1.1 + 1.4) / 4
        assert float(loss) == pytest.approx(want)
        assert m["actor/clip_frac"] == pytest.approx(0.25)
        assert m["actor/clip_frac_high"] == pytest.approx(0.25 if clipped_at == "high" else 0.0)
        assert m["actor/clip_frac_low"] == pytest.approx(0.25 if clipped_at == "low" else 0.0)
    # without the DAPO bounds both sides use clip_ratio (0.5): nothing is clipped
    loss, m = grpo_loss(lp, old, torch.tensor([1.0]), mask, clip_ratio=0.5)
    assert float(loss) == pytest.approx(-(0.7 + 0.9 + 1.1 + 1.4) / 4) and m["actor/clip_frac"] == 0.0
    # one bound set: the other stays clip_ratio
    _, m = grpo_loss(lp, old, torch.tensor([1.0]), mask, clip_ratio=0.2, clip_ratio_high=0.5)
    assert m["actor/clip_frac_high"] == 0.0
    _, m = grpo_loss(lp, old, torch.tensor([-1.0]), mask, clip_ratio=0.5, clip_ratio_low=0.2)
    assert m["actor/clip_frac_low"] == pytest.approx(0.25)


def test_zero_advantage_counts_as_neither_side():
    lp = _ratios([0.5, 2.0])
    _, m = grpo_loss(lp, torch.zeros(1, 2), torch.tensor([0.0]), torch.ones(1, 2))
    assert (m["actor/clip_frac"], m["actor/clip_frac_low"], m["actor/clip_frac_high"]) == (0.0, 0.0, 0.0)


def test_kl_and_entropy_coefficients_of_one_are_applied():
    ref = torch.full((2, 3), -1.0)
    ent = torch.full((2, 3), 0.5)
    base, _ = grpo_loss(LP, None, ADV, MASK)
    with_kl, m = grpo_loss(LP, None, ADV, MASK, ref_log_probs=ref, kl_coef=1.0, kl_kind="kl")
    assert float(with_kl - base) == pytest.approx(1.0) and m["actor/kl"] == pytest.approx(1.0)
    with_ent, m = grpo_loss(LP, None, ADV, MASK, entropy=ent, entropy_coeff=1.0)
    assert float(with_ent - base) == pytest.approx(-0.5) and m["actor/entropy"] == pytest.approx(0.5)
    _, m = grpo_loss(LP, None, ADV, MASK)
    assert m["actor/kl"] == 0.0 and m["actor/entropy"] == 0.0


def test_missing_inputs_for_a_coefficient_are_errors():
    with pytest.raises(ValueError, match=r"^kl_coef is non-zero but ref_log_probs is None$"):
        grpo_loss(LP, None, ADV, MASK, kl_coef=0.1)
    with pytest.raises(ValueError, match=r"^entropy_coeff is non-zero but entropy is None$"):
        grpo_loss(LP, None, ADV, MASK, entropy_coeff=0.1)


@pytest.mark.parametrize("count", [0, -1.0])
def test_token_count_must_be_positive(count):
    with pytest.raises(ValueError, match=rf"^token_count must be positive, got {count}$"):
        grpo_loss(LP, None, ADV, MASK, token_count=count)


@pytest.mark.parametrize("count", [1, 0.5, torch.tensor(8.0)])
def test_any_positive_token_count_divides(count):
    loss, _ = grpo_loss(LP, None, ADV, MASK, token_count=count)
    assert float(loss) == pytest.approx(-7 / float(count))


def test_mask_and_advantages_follow_the_log_probs_dtype():
    loss, _ = grpo_loss(LP, None, ADV.double(), MASK.double())
    assert loss.dtype == torch.float32
    loss, _ = grpo_loss(LP, None, ADV, MASK.bool(), token_level_loss=False)
    assert loss.dtype == torch.float32 and float(loss) == pytest.approx(-1.5)


def test_non_finite_values_at_padding_do_not_leak():
    lp = torch.tensor([[0.0, float("nan"), float("-inf")], [0.0, 0.0, 0.0]])
    ent = torch.tensor([[0.5, float("inf"), float("nan")], [0.5, 0.5, 0.5]])
    ref = torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])
    for token_level in (True, False):
        loss, m = grpo_loss(lp, lp.detach().nan_to_num(0.0), ADV, MASK, ref_log_probs=ref, entropy=ent,
                            kl_coef=0.1, entropy_coeff=0.1, token_level_loss=token_level)
        assert math.isfinite(float(loss)), token_level
        assert all(math.isfinite(v) for v in m.values()), m
        assert m["actor/entropy"] == pytest.approx(0.5)


def test_group_norm_advantages_use_eps_in_the_denominator():
    adv = compute_group_norm_advantages(torch.tensor([0.0, 2.0]), n_samples=2, eps=0.5)
    std = math.sqrt(2.0)  # unbiased
    assert adv.tolist() == pytest.approx([-1 / (std + 0.5), 1 / (std + 0.5)])


def test_group_norm_advantage_errors_say_why():
    with pytest.raises(ValueError, match=r"^n_samples must be >= 1, got 0$"):
        compute_group_norm_advantages(torch.zeros(4), n_samples=0)
    with pytest.raises(ValueError, match=r"^rewards must be 1-D, got shape \(2, 2\)$"):
        compute_group_norm_advantages(torch.zeros(2, 2), n_samples=2)
    with pytest.raises(ValueError, match=r"^5 rewards do not split into groups of 2$"):
        compute_group_norm_advantages(torch.zeros(5), n_samples=2)


def test_low_var_kl_of_an_impossible_token_is_bounded():
    """A -inf log-prob (a token the policy cannot sample) gives the clamp's 10, not NaN."""
    out = kl_penalty(torch.tensor([float("-inf"), 0.0]), torch.tensor([0.0, float("-inf")]), "low_var_kl")
    assert out.tolist() == [10.0, 10.0]
