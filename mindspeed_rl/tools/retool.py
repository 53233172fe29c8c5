"""``ReTool``: the ReTool recipe's code interpreter (``code_interpreter``), a ``SandboxFusionTool`` that first
tidies the model's code as upstream does:

- the first fenced block opened by three backticks + ``python`` (or ``python3`` / ``py``) replaces the code;
- the last statement is printed when it is a bare expression, so ``x * 2`` at the end shows its value.
  Upstream wraps the last non-empty LINE in ``print(...)`` unless it starts with "print", which breaks code
  whose last line is inside a block (``    return x``) or continues a statement; here ``ast`` decides: only a
  top-level expression statement that is not already a ``print(...)`` call is wrapped, and code that does not
  parse is run as written (Python then reports the syntax error)."""
import ast
import re

from mindspeed_rl.tools.sandbox_fusion_tool import SandboxFusionTool
from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema, function_tool_schema

FENCE = re.compile(r"```(?:python3?|py)[ \t]*\n(.*?)```", re.DOTALL)


def extract_fenced_code(code: str) -> str:
    match = FENCE.search(code)
    return match.group(1).strip() if match else code


def print_last_expression(code: str) -> str:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    value = tree.body[-1].value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
        return code
    data = code.encode("utf-8")  # ast offsets count UTF-8 bytes
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    begin = starts[value.lineno - 1] + value.col_offset
    end = starts[value.end_lineno - 1] + value.end_col_offset
    return (data[:begin] + b"print(" + data[begin:end] + b")" + data[end:]).decode("utf-8")


class ReTool(SandboxFusionTool):
    @classmethod
    def default_tool_schema(cls) -> OpenAIFunctionToolSchema:
        return function_tool_schema("code_interpreter", "Runs Python code and returns what it prints.",
                                    code=("string", "The Python code to run."))

    def prepare_code(self, code: str) -> str:
        return print_last_expression(extract_fenced_code(code))
