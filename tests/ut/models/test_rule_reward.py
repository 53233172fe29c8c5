import pytest
import torch

from mindspeed_rl.models.rule_reward import TEXT_VERIFIERS, VERIFIERS, RuleReward, copy_match, length_match
from mindspeed_rl.models.tiny_model import build_toy_tokenizer

EOS = 13


def t(*xs):
    return torch.tensor(xs, dtype=torch.long)


def test_registry_names():
    assert set(VERIFIERS) == {"length_match", "copy_match"}
    assert set(TEXT_VERIFIERS) == {"base_acc", "format"}


@pytest.mark.parametrize("response,target,expected", [
    (t(1, 2, 3, EOS), 3, 1.0),            # exact length
    (t(1, 2, 3, EOS, 5, 5), 3, 1.0),      # tokens after EOS ignored
    (t(1, EOS), 3, 0.75),                 # |1 - 3| / 8
    (t(EOS), 8, 0.0),                     # length 0 vs 8
    (t(), 2, 0.75),                       # empty response has length 0
    (t(7, 7, 7, 7, 7), 1, 0.5),           # no EOS: whole response counts
    (t(*([4] * 10)), 1, 0.0),             # clipped at 0
])
def test_length_match(response, target, expected):
    assert length_match(response, t(target), EOS) == pytest.approx(expected)


@pytest.mark.parametrize("response,label,expected", [
    (t(4, 5, 6, EOS), t(4, 5, 6), 1.0),
    (t(4, 0, 6), t(4, 5, 6), 2 / 3),      # no EOS
    (t(5, 6, EOS), t(4, 5, 6), 0.0),      # shifted by one: no position matches
    (t(4, EOS, 6), t(4, 5, 6), 1 / 3),    # nothing after EOS counts
    (t(4), t(4, 5, 6), 1 / 3),            # short response
    (t(), t(4, 5, 6), 0.0),               # empty response
    (t(4, 5, 6, 7, 8), t(4, 5, 6), 1.0),  # only the first 3 tokens count
])
def test_copy_match(response, label, expected):
    assert copy_match(response, label, EOS) == pytest.approx(expected)


def test_weighted_sum_of_token_and_text_verifiers():
    # toy ids 0-9 are the digits: "456" decodes to 456; tokens after EOS never count
    reward = RuleReward(["copy_match", "base_acc"], [0.5, 2.0], eos_id=EOS, tokenizer=build_toy_tokenizer())
    try:
        out = reward([t(4, 5, 6, EOS), t(4, 0, 6, EOS), t(EOS, 4, 5, 6)], [t(4, 5, 6), t(4, 5, 6), t(4, 5, 6)])
    finally:
        reward.close()
    assert out.dtype == torch.float32 and out.shape == (3,)
    assert torch.allclose(out, torch.tensor([0.5 + 2.0, 0.5 * 2 / 3, 0.0]))
    assert reward.last_metrics["reward/base_acc/mean"] == pytest.approx(1 / 3)
    assert reward.last_metrics["reward/base_acc/no_answer"] == 1.0  # the empty response


def test_single_verifier_on_length_task():
    reward = RuleReward(["length_match"], [1.0], eos_id=EOS)
    out = reward([t(1, 1, EOS), t(1, 1, 1, 1)], [t(2), t(8)])
    assert torch.allclose(out, torch.tensor([1.0, 0.5]))


def test_errors():
    with pytest.raises(ValueError, match="length_match"):
        RuleReward(["nope"], [1.0], eos_id=EOS)
    with pytest.raises(ValueError, match="cannot be imported"):
        RuleReward(["no.such.module:f"], [1.0], eos_id=EOS, tokenizer=build_toy_tokenizer())
    with pytest.raises(ValueError):
        RuleReward(["base_acc", "copy_match"], [1.0], eos_id=EOS)
    with pytest.raises(ValueError, match="need the tokenizer"):
        RuleReward(["base_acc"], [1.0], eos_id=EOS)
    reward = RuleReward(["copy_match"], [1.0], eos_id=EOS)
    with pytest.raises(ValueError):
        reward([t(1)], [t(1), t(2)])
