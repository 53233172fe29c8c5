"""An unknown verifier name's error offers at most three close names, joined by ' or '."""
import re

import pytest

from mindspeed_rl.rewards.rule_reward import text_verifier_path


def test_hint_lists_at_most_three_close_names():
    # 'mat_acc' is close to four names (math_acc, math_17k_acc, base_acc, acc); the hint keeps the best three
    with pytest.raises(ValueError) as err:
        text_verifier_path("mat_acc")
    assert re.match(r"^unknown verifier 'mat_acc' \(did you mean 'math_acc' or 'math_17k_acc' or 'base_acc'\?\); "
                    r"known: acc, ", str(err.value)), str(err.value)


def test_no_hint_without_a_close_name():
    with pytest.raises(ValueError, match=r"^unknown verifier 'zzz'; known: acc, .*, or 'module:function'$"):
        text_verifier_path("zzz")
