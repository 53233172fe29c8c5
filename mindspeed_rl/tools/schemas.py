"""OpenAI function-tool schemas (upstream's names and fields) and verl's ``ToolResponse``.

A tool config YAML's ``tool_schema`` is validated with ``OpenAIFunctionToolSchema.model_validate``; keys these
models do not name (e.g. upstream's ``item`` in an array property) are ignored, as upstream."""
import json
from typing import Any, Dict, List, Literal, Optional, Tuple

from pydantic import BaseModel, Field


class OpenAIFunctionPropertySchema(BaseModel):
    """One argument of a function: its JSON type, what it means, and optionally the allowed values."""
    type: str
    description: Optional[str] = None
    enum: Optional[List[str]] = None


class OpenAIFunctionParametersSchema(BaseModel):
    """The arguments of a function: a JSON object's properties and which of them a call must give."""
    type: str
    properties: Dict[str, OpenAIFunctionPropertySchema]
    required: List[str]


def _no_parameters() -> OpenAIFunctionParametersSchema:
    return OpenAIFunctionParametersSchema(type="object", properties={}, required=[])


class OpenAIFunctionSchema(BaseModel):
    name: str
    description: str
    parameters: OpenAIFunctionParametersSchema = Field(default_factory=_no_parameters)
    strict: bool = False


class OpenAIFunctionToolSchema(BaseModel):
    """What the model is told about a tool (the ``tools`` list of a chat template)."""
    type: str
    function: OpenAIFunctionSchema


def function_tool_schema(name: str, description: str, **arguments: Tuple[str, str]) -> OpenAIFunctionToolSchema:
    """A function tool's schema whose every argument is required: ``arguments``: name -> (JSON type, meaning)."""
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "required": list(arguments), "properties": {
            arg: {"type": kind, "description": meaning} for arg, (kind, meaning) in arguments.items()}}}})


class OpenAIFunctionParsedSchema(BaseModel):
    """A call as parsed from the model's text: ``arguments`` is still a JSON string."""
    name: str
    arguments: str


class OpenAIFunctionCallSchema(BaseModel):
    """A call with its arguments decoded."""
    name: str
    arguments: Dict[str, Any]

    @staticmethod
    def from_openai_function_parsed_schema(
            parsed_schema: OpenAIFunctionParsedSchema) -> Tuple["OpenAIFunctionCallSchema", bool]:
        """``(call, has_decode_error)``: arguments that are not a JSON object become ``{}`` with the flag set."""
        try:
            arguments = json.loads(parsed_schema.arguments)
        except json.JSONDecodeError:
            return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments={}), True
        if not isinstance(arguments, dict):
            return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments={}), True
        return OpenAIFunctionCallSchema(name=parsed_schema.name, arguments=arguments), False


class OpenAIFunctionToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: OpenAIFunctionCallSchema


class ToolResponse(BaseModel):
    """A tool's answer (verl's form); only ``text`` is used by text models."""
    text: Optional[str] = None
    image: Optional[List[Any]] = None
    video: Optional[List[Any]] = None
