"""ReTool's code tidying: the first python fence is taken, a final top-level expression is printed."""
import pytest

from mindspeed_rl.tools.retool import ReTool, extract_fenced_code, print_last_expression


@pytest.mark.parametrize("code, expected", [
    ("Here:\n```python\nx = 2\nx * 3\n```\nthat is all", "x = 2\nx * 3"),
    ("```py\na = 1\n```", "a = 1"),
    ("```python3\nb = 2\n```", "b = 2"),
    ("```python\nfirst = 1\n```\n```python\nsecond = 2\n```", "first = 1"),
    ("```\nplain = 1\n```", "```\nplain = 1\n```"),  # a fence without a language stays
    ("x = 1", "x = 1"),
])
def test_the_first_python_fence_replaces_the_code(code, expected):
    assert extract_fenced_code(code) == expected


@pytest.mark.parametrize("code, expected", [
    ("x = 2\nx * 3", "x = 2\nprint(x * 3)"),
    ("x = 2\nx * 3\n\n", "x = 2\nprint(x * 3)\n\n"),
    ("x = 2  \n  \n", "x = 2  \n  \n"),                              # last statement not an expression
    ("print(1)", "print(1)"),                                          # already printed
    ("print_table()", "print(print_table())"),                         # a call named print... is not print
    ("for i in range(3):\n    i", "for i in range(3):\n    i"),       # inside a block: left alone
    ("def f():\n    return 4\nf()", "def f():\n    return 4\nprint(f())"),
    ("total = sum([1,\n  2])\ntotal", "total = sum([1,\n  2])\nprint(total)"),
    ("max(1,\n    2)", "print(max(1,\n    2))"),                       # an expression over two lines
    ("a = 1; a", "a = 1; print(a)"),                                   # after a semicolon
    ("s = 'é✓'; s", "s = 'é✓'; print(s)"),                           # offsets are UTF-8 bytes
    ("x  # show x", "print(x)  # show x"),
    ("if True:\n  y = 1\ny", "if True:\n  y = 1\nprint(y)"),
    ("x = (", "x = ("),                                                # does not parse: run as written
    ("", ""),
])
def test_a_final_top_level_expression_is_printed(code, expected):
    assert print_last_expression(code) == expected


def test_retool_tidies_fence_then_expression(monkeypatch):
    from mindspeed_rl.tools import sandbox
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: None)
    tool = ReTool({}, None)
    assert tool.prepare_code("Run it:\n```python\nimport math\nmath.pi\n```") == "import math\nprint(math.pi)"
