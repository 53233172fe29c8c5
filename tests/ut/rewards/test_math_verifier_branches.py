"""Every branch of the text verifiers with its (score, outcome): the outcome is what the reward
metrics count, so it is part of the behaviour. Answer extraction in upstream's order, the windows
the DAPO and ReTool checks read, the chat-template cut of ``acc`` and the string fallback."""
import pytest

from mindspeed_rl.rewards import math_verifier as mv

R1 = "<think>t</think><answer>{}</answer>"


@pytest.mark.parametrize("text, answer", [
    # a Minerva "final answer is $...$. I hope" wins over everything, up to the first "$. I hope"
    ("The final answer is $\\frac{1}{2}$. I hope it is correct.", "\\frac{1}{2}"),
    ("\\boxed{3}. The final answer is $4$. I hope it is correct.", "4"),
    ("final answer is $1$. I hope so$. I hope", "1"),
    ("final answer is $1 and final answer is $2$. I hope", "1 and final answer is $2"),
    ("final answer is $5 without the closing words", "$5 without the closing words"),  # not Minerva
    ("ends with $. I hope it is 6", "6"),
    # the last "boxed": balanced braces, or up to '$' without a brace
    ("\\boxed{3} then \\boxed{4}", "4"),
    ("so \\boxed 5$ and more", "5"),
    ("so \\boxed{57", "57"),                                          # unbalanced: the rest
    ("it is boxed", ""),
    # all after the last "the answer is"
    ("The answer is 3.\nNo wait, the answer is x + 1", "x + 1"),
    ("the answer is:7", "7"),
    ("the answer is 42.", "42"),
    ("the answer is 7/", "7"),
    ("the answer is 1\n  2", "12"),
    # after the last "final answer is"
    ("my final answer is 1, my final answer is x - 2", "x - 2"),
    # after the first "答案是", first paragraph only
    ("所以答案是 5\n\n后面还有 7", "5"),
    # else the last number (thousands commas dropped)
    ("we get 1,234 apples", "1234"),
    ("first 3 then -2.5 at last", "-2.5"),
    ("no digits here", ""),
])
def test_toolkit_answer(text, answer):
    assert mv.toolkit_answer(text) == answer


@pytest.mark.parametrize("text, normal", [
    ("\\text{ A b }.", "ab"),
    ("$0.5$.", "0.5"),
    (" X\ty\n", "xy"),
    (".5", ".5"),
])
def test_fallback_normal_form(text, normal):
    assert mv._normalise(text) == normal


@pytest.mark.parametrize("text, answer", [
    ("the answer is $42$", "42"),
    ("The answer is: $x$.", "x"),
])
def test_final_answer_drops_dollars(text, answer):
    assert mv.final_answer(text) == answer


CHAT = "<|im_start|>user\nwhat is 3+4? \\boxed{9}<|im_end|>\n<|im_start|>assistant\n\\boxed{7}<|im_end|>"


@pytest.mark.parametrize("response, label, result", [
    ("so \\boxed{7}", "7", (1.0, "math_verify")),
    ("so \\boxed{6}", "7", (-0.5, "math_verify")),
    ("the answer is 7", "7", (-1.0, "no_boxed")),
    ("", "7", (-1.0, "no_answer")),
    ("it is boxed", "7", (-1.0, "no_answer")),
    (CHAT, "7", (1.0, "math_verify")),                 # the prompt's turns are cut off first
    ("\\boxed{7}</s> \\boxed{9}", "7", (1.0, "math_verify")),
    ("\\boxed{7}<|endoftext|> \\boxed{9}", "7", (1.0, "math_verify")),
    ("\\boxed{7}<|im_end|> \\boxed{9}", "7", (1.0, "math_verify")),
    ("\\boxed{\\text{}}", "\\text{}", (1.0, "fallback")),
])
def test_acc(response, label, result):
    assert mv.acc(response, label) == result


@pytest.mark.parametrize("response, label, result", [
    ("reasoning\nAnswer: 7", "7", (1.0, "match")),
    ("Answer: 8", "7", (-1.0, "no_match")),
    ("no answer line", "7", (-1.0, "no_answer")),
    ("Answer: 7\n" + "x" * 290, "7", (1.0, "match")),      # 300 characters: inside the window
    ("Answer: 7\n" + "x" * 291, "7", (-1.0, "no_answer")),  # 301: the 'A' falls out
])
def test_acc_for_dapo(response, label, result):
    assert mv.acc_for_dapo(response, label) == result


@pytest.mark.parametrize("answer, normal", [
    ("$5$ apples", "5"),
    ("\\textbf{12}", "12"),
    ("\\overline{3}", "3"),
    ("\\text{(B)}", "(B)"),
])
def test_minerva_normal_form(answer, normal):
    assert mv.minerva_normalise(answer) == normal


@pytest.mark.parametrize("response, label, result", [
    ("\\boxed{7}", "7", (1.0, "match")),                      # a box at the very start
    ("so \\boxed{1} and \\boxed{2}", "2", (1.0, "match")),    # the last box
    ("so \\boxed{1} and \\boxed{2}", "1", (-1.0, "no_match")),
    ("\\boxed{7", "7", (-1.0, "no_answer")),                  # unbalanced
    ("no box", "7", (-1.0, "no_answer")),
    ("\\boxed{7}" + "." * 91, "7", (1.0, "match")),           # 100 characters: inside the window
    ("\\boxed{7}" + "." * 92, "7", (-1.0, "no_answer")),      # 101: the backslash falls out
])
def test_retool_reward(response, label, result):
    assert mv.retool_reward(response, label) == result


@pytest.mark.parametrize("response, label, result", [
    (R1.format("\\boxed{7}"), "7", (1.0, "math_verify")),
    (R1.format("\\boxed{0.333333}"), "\\frac{1}{3}", (1.0, "math_verify")),  # equal to 6 decimals
    (R1.format("\\boxed{0.33333}"), "\\frac{1}{3}", (0.0, "math_verify")),
    (R1.format("\\boxed{7}"), "\\text{}", (0.0, "bad_label")),
    (R1.format("\\boxed{}"), "7", (0.0, "no_answer")),
    ("\\boxed{7}", "7", (0.0, "no_format")),
])
def test_math_verify_reward(response, label, result):
    assert mv.math_verify_reward(response, label) == result


def test_base_acc_and_math_17k_outcomes():
    assert mv.base_acc("\\boxed{7}", "7") == (0.0, "no_format")
    assert mv.base_acc(R1.format("\\boxed{7}"), "7") == (1.0, "math_verify")
    assert mv.math_17k_acc("no box", "7") == (0.0, "no_answer")


@pytest.mark.parametrize("response, result", [
    ("<think>a</think><answer>7</answer>", (1.0, "match")),
    ("<answer>7</answer>", (0.0, "no_match")),
])
def test_format_outcomes(response, result):
    assert mv.format_reward(response) == result


@pytest.mark.parametrize("response, score", [
    ("Step 1: a\nStep 2: b\nStep 3: c\nStep 4: d\nFinally, e", 1.0),   # capped at one
    ("Second, a", 1 / 3),
])
def test_reasoning_steps_capped_at_one(response, score):
    assert mv.reasoning_steps(response) == (pytest.approx(score), "ok")


def test_warm_up_runs():
    assert mv.warm_up() is None
