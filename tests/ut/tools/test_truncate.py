"""Tool answers cut to max_tool_response_length characters on the named side."""
import pytest

from mindspeed_rl.tools.utils.truncate import TRUNCATE_SIDES, truncate_tool_response

TEXT = "abcdefghij"


@pytest.mark.parametrize("side, max_length, expected", [
    ("left", 4, "abcd...(truncated)"),
    ("right", 4, "(truncated)...ghij"),
    ("middle", 4, "ab...(truncated)...ij"),
    ("middle", 5, "ab...(truncated)...ij"),   # upstream keeps max_length // 2 from each end
    ("middle", 1, "...(truncated)..."),
    ("left", 10, TEXT),
    ("right", 11, TEXT),
    ("middle", 10, TEXT),
])
def test_each_side_keeps_what_its_name_says(side, max_length, expected):
    assert truncate_tool_response(TEXT, max_length, side) == expected


@pytest.mark.parametrize("side", TRUNCATE_SIDES)
@pytest.mark.parametrize("max_length", [0, None])
def test_zero_or_none_means_no_limit(side, max_length):
    assert truncate_tool_response(TEXT, max_length, side) == TEXT


def test_the_sides_are_the_three_upstream_names():
    assert TRUNCATE_SIDES == ("left", "right", "middle")


def test_an_unknown_side_or_a_negative_length_is_refused():
    with pytest.raises(ValueError, match=r"^tool_response_truncate_side must be one of left, right, middle, "
                                         r"got 'center'$"):
        truncate_tool_response(TEXT, 4, "center")
    with pytest.raises(ValueError, match=r"^max_tool_response_length must be >= 0 \(0: no limit\), got -1$"):
        truncate_tool_response(TEXT, -1, "left")


def test_the_side_defaults_to_middle():
    assert truncate_tool_response(TEXT, 4) == "ab...(truncated)...ij"
