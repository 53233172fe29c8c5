"""Tools built from a tool config YAML; every bad input is one ValueError line naming file, entry and field."""
import textwrap

import pytest
import yaml

from mindspeed_rl.tools.utils.tool_registry import get_tool_class, initialize_tools_from_config, tools_by_name

HELPERS = '''
from mindspeed_rl.tools.base_tool import BaseTool

class EchoTool(BaseTool):
    parameters = frozenset({"text"})

    def execute(self, instance_id, parameters, **kwargs):
        return parameters["text"], 0.0, {}

class Boom(BaseTool):
    def __init__(self, config, tool_schema):
        raise RuntimeError("disk\\non fire")

class NotATool:
    def __init__(self, config, tool_schema):
        pass
'''


def schema(name="echo", arg="text"):
    return {"type": "function", "function": {"name": name, "description": "d", "parameters": {
        "type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}}


def entry(cls="my_tools.EchoTool", name="echo", **over):
    out = {"class_name": cls, "config": {"type": "native", "k": 1}, "tool_schema": schema(name)}
    out.update(over)
    return out


@pytest.fixture
def write(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(HELPERS)
    (tmp_path / "broken_tools.py").write_text("raise RuntimeError('half written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def _write(data, text=None):
        path = tmp_path / "tools.yaml"
        path.write_text(text if text is not None else yaml.safe_dump(data))
        return str(path)
    return _write


def test_a_good_file_gives_its_tools_in_order_with_their_config(write):
    path = write({"tools": [entry(), entry(name="echo2"), {"class_name": "my_tools.EchoTool",
                                                           "tool_schema": schema("bare")}]})
    tools = initialize_tools_from_config(path)
    assert [t.name for t in tools] == ["echo", "echo2", "bare"]
    assert tools[0].config == {"type": "native", "k": 1} and tools[2].config == {}
    assert type(tools[0]).__name__ == "EchoTool"
    assert tools[0].tool_schema.function.parameters.required == ["text"]
    assert set(tools_by_name(tools)) == {"echo", "echo2", "bare"}
    assert tools_by_name(tools)["echo2"] is tools[1]


def _error(path):
    with pytest.raises(ValueError) as info:
        initialize_tools_from_config(path)
    message = str(info.value)
    assert "\n" not in message
    return message.replace(path, "P")


@pytest.mark.parametrize("data, text, message", [
    (None, "tools: [", "tool config P: not valid YAML ("),
    (["a"], None, "tool config P: expected a mapping with a 'tools' list, got list"),
    ({"tool": []}, None, "tool config P: 'tools' must be a non-empty list of tool entries"),
    ({"tools": []}, None, "tool config P: 'tools' must be a non-empty list of tool entries"),
    ({"tools": {"a": 1}}, None, "tool config P: 'tools' must be a non-empty list of tool entries"),
    ({"tools": ["my_tools.EchoTool"]}, None,
     "tool config P: tools[0] must be a mapping with keys class_name, config, tool_schema"),
    ({"tools": [entry(shema={})]}, None,
     "tool config P: tools[0]: unknown key 'shema' (known: class_name, config, tool_schema)"),
    ({"tools": [{"tool_schema": schema()}]}, None, "tool config P: tools[0] (echo).class_name is missing"),
    ({"tools": [entry("EchoTool")]}, None,
     "tool config P: tools[0] (echo).class_name: 'EchoTool' is not a 'module.Class' path"),
    ({"tools": [entry("no_such_tools.EchoTool")]}, None,
     "tool config P: tools[0] (echo).class_name: module 'no_such_tools' does not import "
     "(ModuleNotFoundError: No module named 'no_such_tools')"),
    ({"tools": [entry("broken_tools.EchoTool")]}, None,
     "tool config P: tools[0] (echo).class_name: module 'broken_tools' does not import "
     "(RuntimeError: half written)"),
    ({"tools": [entry("my_tools.EchoTol")]}, None,
     "tool config P: tools[0] (echo).class_name: module 'my_tools' has no attribute 'EchoTol'"),
    ({"tools": [entry("my_tools.NotATool")]}, None,
     "tool config P: tools[0] (echo).class_name: my_tools.NotATool is not a BaseTool subclass"),
    ({"tools": [entry(config=[1])]}, None, "tool config P: tools[0] (echo).config must be a mapping, got list"),
    ({"tools": [entry(config={"type": "mcp"})]}, None,
     "tool config P: tools[0] (echo).config.type 'mcp' is not supported (only 'native')"),
    ({"tools": [entry(tool_schema={"type": "function", "function": {"description": "d"}})]}, None,
     "tool config P: tools[0].tool_schema is not valid: function.name: Field required"),
    ({"tools": [entry(tool_schema={"function": {"name": "x", "description": 3}})]}, None,
     "tool config P: tools[0].tool_schema is not valid: type: Field required; function.description: "
     "Input should be a valid string"),
    ({"tools": [entry("my_tools.Boom", name="boom")]}, None,
     "tool config P: tools[0] (boom): tool boom (Boom) failed to start: disk on fire"),
    ({"tools": [entry(tool_schema=schema(arg="cmd"))]}, None,
     "tool config P: tools[0]: tool echo (EchoTool): the schema names the argument 'cmd' but the tool reads "
     "only 'text'"),
    ({"tools": [entry(), entry(config={})]}, None,
     "tool config P: tools[1] (echo): the name is already used by tools[0]"),
])
def test_bad_files_get_one_line_naming_file_entry_and_field(write, data, text, message):
    got = _error(write(data, text))
    if message.endswith("("):
        assert got.startswith(message) and got.endswith(")")
    else:
        assert got == message


def test_a_missing_file_is_named(tmp_path):
    path = str(tmp_path / "none.yaml")
    with pytest.raises(ValueError, match=r"^tool config .*none\.yaml: file not found$"):
        initialize_tools_from_config(path)


def test_a_class_without_schema_uses_its_default_name_in_the_start_error(write, monkeypatch):
    from mindspeed_rl.tools import sandbox
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: "sandbox: bwrap missing")
    got = _error(write({"tools": [{"class_name": "mindspeed_rl.tools.retool.ReTool"}]}))
    assert got == "tool config P: tools[0]: tool code_interpreter (ReTool) failed to start: sandbox: bwrap missing"


def test_get_tool_class_returns_the_class():
    from mindspeed_rl.tools.retool import ReTool
    assert get_tool_class("mindspeed_rl.tools.retool.ReTool") is ReTool


def test_tools_by_name_refuses_two_tools_with_one_name(write):
    tools = initialize_tools_from_config(write({"tools": [entry(), entry(name="other")]}))
    tools[1].name = "echo"
    with pytest.raises(ValueError, match=r"^two tools are named 'echo': EchoTool and EchoTool$"):
        tools_by_name(tools)


def test_the_yaml_is_read_as_plain_yaml(write):
    # OmegaConf would resolve ${...}; plain YAML hands the text on as written
    tools = initialize_tools_from_config(write({"tools": [entry(config={"path": "${oc.env:HOME}"})]}))
    assert tools[0].config == {"path": "${oc.env:HOME}"}
