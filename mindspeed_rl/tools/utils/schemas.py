"""Upstream's path of the tool schemas (``mindspeed_rl.tools.schemas`` holds them)."""
from mindspeed_rl.tools.schemas import (  # noqa: F401
    OpenAIFunctionCallSchema, OpenAIFunctionParametersSchema, OpenAIFunctionParsedSchema,
    OpenAIFunctionPropertySchema, OpenAIFunctionSchema, OpenAIFunctionToolCall, OpenAIFunctionToolSchema,
    ToolResponse)
