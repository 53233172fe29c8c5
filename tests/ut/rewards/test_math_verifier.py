"""The text verifiers on hand-written responses, with the scores upstream's verifiers give."""
import pytest

from mindspeed_rl.rewards import math_verifier as mv
from mindspeed_rl.rewards.math_verifier import final_answer, format_reward, math_acc, toolkit_answer

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
def test_math_acc_cases(response, label, score, how):
    assert math_acc(response, label) == (score, how)


def test_final_answer_keeps_nested_braces():
    assert final_answer("x \\boxed{\\frac{1}{\\sqrt{2}}} y") == "\\frac{1}{\\sqrt{2}}"


R1 = "<think>3 + 4 = 7</think>\n<answer>so \\boxed{7}</answer>"


def test_the_last_answer_is_taken_not_the_first():
    text = "First guess: the answer is 3. On reflection the answer is 4. Done."
    assert final_answer(text) == "4"
    assert math_acc(text, "4") == (1.0, "math_verify") and math_acc(text, "3")[0] == 0.0
    assert toolkit_answer("The answer is 3.\nNo wait, the answer is 4") == "4"
    assert toolkit_answer("\\boxed{3} then \\boxed{4}") == "4"


@pytest.mark.parametrize("response,score", [
    ("<think>add</think><answer>\\boxed{7}</answer>", 1.0),
    ("<think>add</think><answer>7</answer>", 1.0),              # no boxed answer needed
    ("<think>a\nb</think>\n\n<answer>7</answer>", 1.0),
    ("<think>add</think><answer>7</answer>\nmore", 1.0),        # '$' matches before a newline (MULTILINE)
    ("  <think>add</think><answer>7</answer>", 0.0),            # must start with <think>
    ("<answer>\\boxed{7}</answer>", 0.0),                       # no thinking
    ("<think>add</think>\\boxed{7}", 0.0),                      # no answer tags
    ("<think>add</think><answer>7</answer> more", 0.0),         # text after the answer on its line
])
def test_format(response, score):
    assert format_reward(response)[0] == score


@pytest.mark.parametrize("response,score", [
    ("<think>add</think><answer>\\boxed{7}</answer>", 1.0),
    ("<think>a</think> x <answer>so \\boxed{7}.</answer>", 1.0),
    ("<think>add</think><answer>7</answer>", -0.5),             # no boxed answer
    ("<think>add</think><answer>\\boxed{7} \\boxed{7}</answer>", -0.5),  # two boxed answers
    ("<think>a</think><think>b</think><answer>\\boxed{7}</answer>", -0.5),  # a tag twice
    ("<think>add</think>\\boxed{7}<answer></answer>", -0.5),    # boxed outside the answer
    ("<think>add</think><answer>\\boxed{7}</answer>\n", -0.5),  # must end with </answer>
    (" <think>add</think><answer>\\boxed{7}</answer>", -0.5),   # must start with <think>
])
def test_strict_format(response, score):
    assert mv.strict_format(response, "") == (score, "match" if score == 1.0 else "no_match")


@pytest.mark.parametrize("response,label,score", [
    (R1, "7", 1.0),
    (R1, "8", 0.0),
    ("<think>x</think><answer>\\boxed{\\frac{1}{2}}</answer>", "0.5", 1.0),   # equality by math-verify
    ("the answer is \\boxed{7}", "7", 0.0),                                    # no R1 shape
    ("<think>x</think><answer>7</answer>", "7", 0.0),                         # no boxed answer
])
def test_base_acc_needs_the_r1_shape_and_a_right_boxed_answer(response, label, score):
    assert mv.base_acc(response, label)[0] == score


@pytest.mark.parametrize("name", ["math_17k_acc", "acc_for_ppo"])
def test_math_17k_acc_reads_the_last_boxed_answer_only(name):
    f = getattr(mv, name)
    assert f("so \\boxed{7}", "7") == (1.0, "math_verify")
    assert f("\\boxed{7} no, \\boxed{8}", "7")[0] == 0.0
    assert f("the answer is 7", "7") == (0.0, "no_answer")
    assert f(R1, "7")[0] == 1.0


@pytest.mark.parametrize("response,label,score", [
    (R1, "7", 1.0),
    (R1, "8", 0.0),
    ("<think>x</think><answer>\\boxed{\\dfrac{3}{4}}</answer>", "0.75", 1.0),
    ("\\boxed{7}", "7", 0.0),                                  # no R1 shape
])
def test_math_verify_reward(response, label, score):
    assert mv.math_verify_reward(response, label)[0] == score


@pytest.mark.parametrize("response,label,score", [
    ("so \\boxed{7}", "7", 1.0),
    ("so \\boxed{6}", "7", -0.5),                              # wrong
    ("the answer is 7", "7", -1.0),                            # right but not boxed
    ("", "7", -1.0),                                           # nothing
    ("<|im_start|>assistant\n\\boxed{7}<|im_end|> \\boxed{9}", "7", 1.0),  # cut at the stop word
])
def test_acc(response, label, score):
    assert mv.acc(response, label)[0] == score


@pytest.mark.parametrize("response,label,score", [
    ("reasoning...\nAnswer: 7", "7", 1.0),
    ("Answer: 3\nAnswer: $7$", "7", 1.0),                      # the last "Answer:" line
    ("Answer: 7\nAnswer: 3", "7", -1.0),
    ("answer : 1,000 dollars", "1000", 1.0),                   # Minerva normalisation: commas, units
    ("Answer: x = \\frac12", "\\frac{1}{2}", 1.0),             # right of '=', \fracab -> \frac{a}{b}
    ("Answer: \\text{(B)}", "(B)", 1.0),
    ("the result is 7", "7", -1.0),                            # no "Answer:" line
    ("Answer: 7" + " pad" * 80, "7", -1.0),                    # only the last 300 characters count
    ("Answer: 0.5", "\\frac{1}{2}", -1.0),                     # strings, not math
])
def test_acc_for_dapo(response, label, score):
    assert mv.acc_for_dapo(response, label)[0] == score


def test_minerva_normalise():
    assert mv.minerva_normalise("$\\boxed{12}$ inches") == "12"
    assert mv.minerva_normalise("\\sqrt2") == "\\sqrt{2}"
    assert mv.minerva_normalise("90^\\circ") == "90"


@pytest.mark.parametrize("response,label,score", [
    ("so \\boxed{7}", "7", 1.0),
    ("so \\boxed{ 7}", "7", -1.0),                             # exact strings
    ("\\boxed{7}" + "." * 100, "7", -1.0),                     # only the last 100 characters
    ("no box", "7", -1.0),
])
def test_retool_reward(response, label, score):
    assert mv.retool_reward(response, label)[0] == score


@pytest.mark.parametrize("response,score", [
    ("Step 1: a\nStep 2: b\nStep 3: c", 1.0),
    ("First, a. Next, b.", 2 / 3),
    ("1. a\n- b", 2 / 3),                                      # '1.' only at the very start
    ("just an answer", 0.0),
])
def test_reasoning_steps(response, score):
    assert mv.reasoning_steps(response, "")[0] == pytest.approx(score)
