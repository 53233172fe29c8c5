"""Answer extraction at its edges: a \\boxed without a brace after it falls back to the one before,
'$' and case in the answers, the first paragraph after 答案是, and the fallback's normal form."""
from mindspeed_rl.rewards import math_verifier as mv


def test_last_boxed_falls_back_past_a_boxed_without_brace():
    assert mv.last_boxed("\\boxed{7} and then \\boxed") == "7"  # a \boxed at index 0 counts
    assert mv.last_boxed("\\boxed{1}, \\boxed{2}, \\boxed") == "2"  # the nearest earlier one
    assert mv.last_boxed("{1} \\boxed") is None  # braces before the \boxed are not its argument
    assert mv.last_boxed("\\boxedx {3}") is None  # only spaces may stand between \boxed and '{'


def test_final_answer_strips_dollars_only():
    assert mv.final_answer("so the answer is $2X$.") == "2X"


def test_toolkit_answer_takes_the_first_paragraph_after_daan_shi():
    assert mv.toolkit_answer("因此 答案是 x + 1\n\n其他") == "x + 1"


def test_fallback_normal_form_strips_full_stops_then_lowercases():
    assert mv._normalise("\\text{MAX}.") == "max"
    assert mv._normalise("$Yes X$.") == "yesx"


def test_text_with_its_own_dollars_is_parsed_as_written():
    # 'a$b' has no maths between dollars: math-verify finds nothing, the normalised strings decide
    assert mv.check_answer("a$b", "a") == (0.0, "fallback")
