"""base_acc and format on hand-written responses; verifiers that hang or crash."""
import time

import pytest

from mindspeed_rl.models.math_verifier import base_acc, final_answer, format_reward
from mindspeed_rl.models.verifier_pool import VerifierPool

CASES = [
    # (response, label, score, how it was decided)
    ("so the answer is \\boxed{42}.", "42", 1.0, "math_verify"),
    ("\\boxed{ 42 }", "42", 1.0, "math_verify"),
    ("\\boxed{41}", "42", 0.0, "math_verify"),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0, "math_verify"),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0, "math_verify"),
    ("\\boxed{1/2}", "\\frac{1}{2}", 1.0, "math_verify"),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", 1.0, "math_verify"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0, "math_verify"),
    ("\\boxed{x = 3}", "3", 1.0, "math_verify"),
    ("\\boxed{50\\%}", "50", 1.0, "math_verify"),
    ("\\boxed{42 \\text{ cm}}", "42", 1.0, "math_verify"),
    ("\\boxed{1,000}", "1000", 1.0, "math_verify"),
    ("\\boxed{-7}", "-7", 1.0, "math_verify"),
    ("\\boxed{7}", "-7", 0.0, "math_verify"),
    ("\\boxed{3.14}", "3.14", 1.0, "math_verify"),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0, "math_verify"),
    ("\\boxed{\\pi}", "\\pi", 1.0, "math_verify"),
    ("\\boxed{10^{3}}", "1000", 1.0, "math_verify"),
    ("first \\boxed{3}, then on reflection \\boxed{4}", "4", 1.0, "math_verify"),  # the last box counts
    ("first \\boxed{4}, then on reflection \\boxed{3}", "4", 0.0, "math_verify"),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0, "math_verify"),
    ("We add 3 and 4, so the answer is 7.", "7", 1.0, "math_verify"),
    ("The answer is: 12", "12", 1.0, "math_verify"),
    ("the answer is 13. Done.", "12", 0.0, "math_verify"),
    ("I think it is 42 but I am not sure", "42", 0.0, "no_answer"),
    ("", "42", 0.0, "no_answer"),
    ("\\boxed{}", "42", 0.0, "no_answer"),
    ("<think>3 + 4 = 7</think><answer>\\boxed{7}</answer>", "7", 1.0, "math_verify"),
    ("\\boxed{\\text{red}}", "red", 1.0, "math_verify"),
    ("\\boxed{\\text{blue}}", "red", 0.0, "math_verify"),
    ("\\boxed{\\text{}}", "\\text{}", 1.0, "fallback"),      # neither side parses: strings decide
    ("\\boxed{\\text{x}}", "\\text{}", 0.0, "fallback"),
    ("456", "456", 1.0, "math_verify"),                         # a bare one-token answer
    ("  456\n", "457", 0.0, "math_verify"),
    ("\\boxed{{5}}", "5", 1.0, "math_verify"),
    ("\\boxed{\\frac{1}{3}}", "0.333", 0.0, "math_verify"),
]


@pytest.mark.parametrize("response,label,score,how", CASES)
def test_base_acc_cases(response, label, score, how):
    assert base_acc(response, label) == (score, how)


def test_final_answer_keeps_nested_braces():
    assert final_answer("x \\boxed{\\frac{1}{\\sqrt{2}}} y") == "\\frac{1}{\\sqrt{2}}"


@pytest.mark.parametrize("response,score", [
    ("<think>add</think><answer>\\boxed{7}</answer>", 1.0),
    ("  <think>a\nb</think>\n<answer>so \\boxed{7}.</answer>\n", 1.0),
    ("<think>add</think><answer>7</answer>", 0.0),            # no boxed answer
    ("<answer>\\boxed{7}</answer>", 0.0),                     # no thinking
    ("<think>add</think>\\boxed{7}", 0.0),                    # no answer tags
    ("<think>add</think><answer>\\boxed{7}</answer> more", 0.0),  # text after the answer
])
def test_format(response, score):
    assert format_reward(response)[0] == score


def test_hanging_or_crashing_verifier_scores_zero_and_the_step_goes_on():
    pool = VerifierPool(processes=2, timeout=1.5)
    try:
        start = time.perf_counter()
        scores, outcomes = pool.score("tests.ut.models.slow_verifier:sleepy", ["ok", "slow", "ok"], ["", "", ""])
        assert time.perf_counter() - start < 20  # far below the 60 s sleep
        assert scores == [1.0, 0.0, 1.0] and outcomes == {"ok": 2, "timeout": 1}
        scores, outcomes = pool.score("tests.ut.models.slow_verifier:crashy", ["crash", "ok"], ["", ""])
        assert scores == [0.0, 1.0] and outcomes == {"error": 1, "ok": 1}
        scores, _ = pool.score("mindspeed_rl.models.math_verifier:base_acc", ["\\boxed{2}"], ["2"])
        assert scores == [1.0]
    finally:
        pool.close()
