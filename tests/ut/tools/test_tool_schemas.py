"""Tool schemas: upstream's YAML form validates, unknown keys are ignored, parsed calls decode their arguments."""
import pytest
from pydantic import ValidationError

from mindspeed_rl.tools import schemas
from mindspeed_rl.tools.schemas import (OpenAIFunctionCallSchema, OpenAIFunctionParsedSchema, OpenAIFunctionSchema,
                                        OpenAIFunctionToolCall, OpenAIFunctionToolSchema, ToolResponse)

SEARCH = {"type": "function", "function": {
    "name": "search", "description": "finds documents",
    "parameters": {"type": "object", "required": ["query_list"], "properties": {
        "query_list": {"type": "array", "item": {"type": "string"}, "description": "queries"}}}}}


def test_upstream_search_schema_validates_and_its_item_key_is_ignored():
    schema = OpenAIFunctionToolSchema.model_validate(SEARCH)
    prop = schema.function.parameters.properties["query_list"]
    assert (schema.function.name, prop.type, prop.description, prop.enum) == ("search", "array", "queries", None)
    assert schema.function.parameters.required == ["query_list"] and schema.function.strict is False
    assert "item" not in prop.model_dump()


def test_a_schema_without_a_function_name_is_refused():
    bad = {"type": "function", "function": {"description": "x"}}
    with pytest.raises(ValidationError, match="function.name"):
        OpenAIFunctionToolSchema.model_validate(bad)


def test_a_function_without_parameters_takes_an_empty_object():
    params = OpenAIFunctionSchema(name="now", description="the time").parameters
    assert (params.type, params.properties, params.required) == ("object", {}, [])


@pytest.mark.parametrize("arguments, expected, error", [
    ('{"code": "print(1)"}', {"code": "print(1)"}, False),
    ('{"code": ', {}, True),
    ('["print(1)"]', {}, True),
])
def test_parsed_calls_decode_their_arguments(arguments, expected, error):
    call, has_error = OpenAIFunctionCallSchema.from_openai_function_parsed_schema(
        OpenAIFunctionParsedSchema(name="code_interpreter", arguments=arguments))
    assert (call.name, call.arguments, has_error) == ("code_interpreter", expected, error)


def test_tool_call_is_a_function_call():
    call = OpenAIFunctionToolCall(id="c1", function=OpenAIFunctionCallSchema(name="f", arguments={}))
    assert call.type == "function"
    with pytest.raises(ValidationError):
        OpenAIFunctionToolCall(id="c1", type="other", function=call.function)


def test_tool_response_holds_text_and_no_media_by_default():
    response = ToolResponse(text="42")
    assert (response.text, response.image, response.video) == ("42", None, None)
    assert ToolResponse().text is None


def test_upstream_module_path_hands_on_the_same_classes():
    from mindspeed_rl.tools.utils import schemas as face
    for name in ("OpenAIFunctionToolSchema", "OpenAIFunctionParsedSchema", "OpenAIFunctionCallSchema",
                 "OpenAIFunctionToolCall", "OpenAIFunctionPropertySchema", "OpenAIFunctionParametersSchema",
                 "OpenAIFunctionSchema", "ToolResponse"):
        assert getattr(face, name) is getattr(schemas, name)


def test_function_tool_schema_builds_the_upstream_form_with_every_argument_required():
    schema = schemas.function_tool_schema("search", "finds documents", query_list=("array", "queries"),
                                          topk=("integer", "how many"))
    assert schema.model_dump() == {"type": "function", "function": {
        "name": "search", "description": "finds documents", "strict": False,
        "parameters": {"type": "object", "required": ["query_list", "topk"], "properties": {
            "query_list": {"type": "array", "description": "queries", "enum": None},
            "topk": {"type": "integer", "description": "how many", "enum": None}}}}}


def test_function_tool_schema_without_arguments_takes_an_empty_object():
    schema = schemas.function_tool_schema("now", "the time")
    params = schema.function.parameters
    assert (schema.type, schema.function.name, schema.function.description) == ("function", "now", "the time")
    assert (params.type, params.properties, params.required) == ("object", {}, [])
