import os

import pytest
import torch

from mindspeed_rl.rewards.rule_reward import (TEXT_VERIFIERS, VERIFIERS, VerifierReward, copy_match, length_match,
                                             verifier_names)
from mindspeed_rl.models.tiny_model import build_toy_tokenizer
from mindspeed_rl.rewards.verifier_pool import VerifierPool

EOS = 13
TEXT_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "..", "..", "data", "tiny_text_tokenizer")
# every name registered in upstream MindSpeed-RL's models/rule_verifier.py at 05a90d7
UPSTREAM_05A90D7 = {"acc", "format", "step", "strict_format", "base_acc", "math_17k_acc", "acc_for_dapo",
                    "acc_for_ppo", "math_verify_reward", "retool_reward"}


def t(*xs):
    return torch.tensor(xs, dtype=torch.long)


def test_registry_names():
    assert set(VERIFIERS) == {"length_match", "copy_match", "tool_match"}
    assert set(TEXT_VERIFIERS) == UPSTREAM_05A90D7 | {"math_acc"}
    assert verifier_names() == sorted(UPSTREAM_05A90D7 | {"math_acc", "length_match", "copy_match", "tool_match"})
    for name in UPSTREAM_05A90D7:  # each resolves to a function of its own module
        VerifierReward([name], [1.0], eos_id=EOS, tokenizer=build_toy_tokenizer()).close()


def test_unknown_name_suggests_the_close_one():
    with pytest.raises(ValueError, match=r"unknown verifier 'math17k_acc' \(did you mean 'math_17k_acc'"):
        VerifierReward(["math17k_acc"], [1.0], eos_id=EOS, tokenizer=build_toy_tokenizer())


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
    reward = VerifierReward(["copy_match", "math_acc"], [0.5, 2.0], eos_id=EOS, tokenizer=build_toy_tokenizer())
    try:
        out = reward([t(4, 5, 6, EOS), t(4, 0, 6, EOS), t(EOS, 4, 5, 6)], [t(4, 5, 6), t(4, 5, 6), t(4, 5, 6)])
    finally:
        reward.close()
    assert out.dtype == torch.float32 and out.shape == (3,)
    assert torch.allclose(out, torch.tensor([0.5 + 2.0, 0.5 * 2 / 3, 0.0]))
    assert reward.last_metrics["reward/math_acc/mean"] == pytest.approx(1 / 3)
    assert reward.last_metrics["reward/math_acc/no_answer"] == 1.0  # the empty response
    assert reward.last_metrics["reward/math_acc/timeouts"] == 0.0 and reward.last_metrics["reward/math_acc/errors"] == 0.0


def test_single_verifier_on_length_task():
    reward = VerifierReward(["length_match"], [1.0], eos_id=EOS)
    out = reward([t(1, 1, EOS), t(1, 1, 1, 1)], [t(2), t(8)])
    assert torch.allclose(out, torch.tensor([1.0, 0.5]))


def test_errors():
    with pytest.raises(ValueError, match="length_match"):
        VerifierReward(["nope"], [1.0], eos_id=EOS)
    with pytest.raises(ValueError, match="cannot be imported"):
        VerifierReward(["no.such.module:f"], [1.0], eos_id=EOS, tokenizer=build_toy_tokenizer())
    with pytest.raises(ValueError):
        VerifierReward(["base_acc", "copy_match"], [1.0], eos_id=EOS)
    with pytest.raises(ValueError, match="need the tokenizer"):
        VerifierReward(["base_acc"], [1.0], eos_id=EOS)
    reward = VerifierReward(["copy_match"], [1.0], eos_id=EOS)
    with pytest.raises(ValueError):
        reward([t(1)], [t(1), t(2)])


def _text_ids(tokenizer, text):
    return torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long)


def test_two_text_verifiers_combine_with_unequal_weights():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TEXT_TOKENIZER)
    eos = tok.eos_token_id
    responses = ["<think>3+4</think><answer>\\boxed{7}</answer>",   # acc 1, strict_format 1
                 "<think>3+4</think><answer>\\boxed{8}</answer>",   # acc -0.5 (wrong), strict_format 1
                 "it is \\boxed{7}",                                # acc 1, strict_format -0.5
                 "the answer is 7"]                                  # acc -1 (no boxed), strict_format -0.5
    reward = VerifierReward(["acc", "strict_format"], [0.7, 0.3], eos_id=eos, tokenizer=tok, timeout=60.0)
    try:
        out = reward([torch.cat([_text_ids(tok, r), torch.tensor([eos])]) for r in responses],
                     [_text_ids(tok, "7")] * 4)
    finally:
        reward.close()
    hand = [0.7 * 1 + 0.3 * 1, 0.7 * -0.5 + 0.3 * 1, 0.7 * 1 + 0.3 * -0.5, 0.7 * -1 + 0.3 * -0.5]
    assert out.tolist() == pytest.approx(hand)  # [1.0, -0.05, 0.55, -0.85]
    m = reward.last_metrics
    assert m["reward/acc/mean"] == pytest.approx((1 - 0.5 + 1 - 1) / 4)
    assert m["reward/strict_format/mean"] == pytest.approx((1 + 1 - 0.5 - 0.5) / 4)
    assert m["reward/acc/no_boxed"] == 1.0 and m["reward/strict_format/match"] == 2.0


def test_hanging_or_crashing_verifier_scores_zero_and_the_step_goes_on():
    # outcomes only: the timer is short against a 60 s hang, and cheap verifiers finish far inside it
    pool = VerifierPool(processes=2, timeout=3.0)
    try:
        scores, outcomes = pool.score("tests.ut.rewards.slow_verifier:sleepy", ["ok", "slow", "ok"], ["", "", ""])
        assert scores == [1.0, 0.0, 1.0] and outcomes == {"ok": 2, "timeout": 1}
        scores, outcomes = pool.score("tests.ut.rewards.slow_verifier:crashy", ["crash", "ok"], ["", ""])
        assert scores == [0.0, 1.0] and outcomes == {"error": 1, "ok": 1}
        # answers that are no number score 0 as errors that say what came back, not as dead workers
        scores, outcomes = pool.score("tests.ut.rewards.slow_verifier:wordy", ["ok", "no"], ["", ""])
        assert scores == [0.0, 0.0] and outcomes == {"error": 2}
        assert pool.first_error == "returned str 'correct', not a score or (score, outcome)"
        scores, _ = pool.score("tests.ut.rewards.slow_verifier:crashy", ["ok"], [""])  # the same workers go on
        assert scores == [1.0]
        # a worker process that dies is named as such; the next call gets fresh workers
        scores, outcomes = pool.score("tests.ut.rewards.slow_verifier:dying", ["die"], [""])
        assert scores == [0.0] and outcomes == {"error": 1} and pool.first_error == "worker died"
        assert pool.score("tests.ut.rewards.slow_verifier:dying", ["ok"], [""])[0] == [1.0]
    finally:
        pool.close()
    pool = VerifierPool(processes=1, timeout=60.0)  # real math: a generous timer
    try:
        scores, outcomes = pool.score("mindspeed_rl.rewards.math_verifier:base_acc",
                                      ["<think>1+1</think><answer>\\boxed{2}</answer>"], ["2"])
        assert scores == [1.0] and outcomes == {"math_verify": 1}
    finally:
        pool.close()


@pytest.mark.parametrize("verifier", ["swallowing", "swallowing_everything", "hang_inside_math_verify"])
def test_a_timeout_caught_inside_the_verifier_still_counts_as_a_timeout(verifier):
    # math-verify's parse catches Exception; a timed-out response must not be scored by its fallback
    pool = VerifierPool(processes=1, timeout=3.0, warm=["mindspeed_rl.rewards.math_verifier:math_acc"])
    try:
        scores, outcomes = pool.score(f"tests.ut.rewards.slow_verifier:{verifier}", ["slow", "7"], ["slow", "7"])
    finally:
        pool.close()
    assert scores == [0.0, 1.0]
    assert outcomes["timeout"] == 1 and "fallback" not in outcomes


def test_the_timer_starts_after_the_worker_is_warm():
    # the module's warm_up() runs in the pool initializer; without it the verifier would hang (60 s) past 3 s
    pool = VerifierPool(processes=1, timeout=3.0, warm=["tests.ut.rewards.slow_verifier:needs_warm_up"])
    try:
        scores, outcomes = pool.score("tests.ut.rewards.slow_verifier:needs_warm_up", ["a", "b"], ["", ""])
    finally:
        pool.close()
    assert scores == [1.0, 1.0] and outcomes == {"ok": 2}


def test_reward_metrics_count_timeouts_and_errors_per_verifier():
    reward = VerifierReward(["tests.ut.rewards.slow_verifier:sleepy", "tests.ut.rewards.slow_verifier:crashy"], [1.0, 1.0],
                        eos_id=EOS, tokenizer=build_toy_tokenizer(), timeout=3.0)
    name_s, name_c = "tests.ut.rewards.slow_verifier:sleepy", "tests.ut.rewards.slow_verifier:crashy"
    try:
        reward.pool.score = _fake_score(reward.pool.score)
        out = reward([t(1, EOS), t(2, EOS)], [t(1), t(1)])
    finally:
        reward.close()
    m = reward.last_metrics
    assert m[f"reward/{name_s}/timeouts"] == 1.0 and m[f"reward/{name_s}/errors"] == 0.0
    assert m[f"reward/{name_c}/timeouts"] == 0.0 and m[f"reward/{name_c}/errors"] == 1.0
    assert out.tolist() == [1.0, 1.0]  # row 0: sleepy timed out (0) + crashy ok; row 1: sleepy ok + crashy crashed


def _fake_score(real):
    # the toy tokenizer decodes digits; map row 0 to "slow" for sleepy and row 1 to "crash" for crashy
    def score(path, responses, labels):
        word = "slow" if path.endswith("sleepy") else "crash"
        row = 0 if word == "slow" else 1
        return real(path, [word if i == row else r for i, r in enumerate(responses)], labels)
    return score
