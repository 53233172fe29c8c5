"""The tool config's messages where the first tests stop: the YAML parser's own words, a schema that is no
mapping, a tool with no name that fails to start, class paths with dots only at an end."""
import pytest
import yaml

from mindspeed_rl.tools.utils.tool_registry import get_tool_class, initialize_tools_from_config

BOOM = '''
from mindspeed_rl.tools.base_tool import BaseTool

class Boom(BaseTool):
    def __init__(self, config, tool_schema):
        raise RuntimeError("no schema and no start")
'''


@pytest.fixture
def write(tmp_path, monkeypatch):
    (tmp_path / "boom_tools.py").write_text(BOOM)
    monkeypatch.syspath_prepend(str(tmp_path))

    def _write(data=None, text=None):
        path = tmp_path / "tools.yaml"
        path.write_text(text if text is not None else yaml.safe_dump(data))
        return str(path)
    return _write


def _error(path):
    with pytest.raises(ValueError) as info:
        initialize_tools_from_config(path)
    return str(info.value).replace(path, "P")


def test_bad_yaml_names_the_parsers_words_on_one_line(write):
    got = _error(write(text="tools: [a,\n  b"))
    assert got.startswith("tool config P: not valid YAML (while parsing a flow sequence in ")
    assert "expected ',' or ']', but got '<stream end>'" in got and "\n" not in got


def test_a_schema_that_is_no_mapping_is_named_at_the_top(write):
    got = _error(write({"tools": [{"class_name": "boom_tools.Boom", "tool_schema": "search"}]}))
    assert got == ("tool config P: tools[0].tool_schema is not valid: (top): Input should be a valid dictionary "
                   "or instance of OpenAIFunctionToolSchema")


def test_a_tool_without_any_schema_that_fails_to_start_is_named_by_its_class(write):
    got = _error(write({"tools": [{"class_name": "boom_tools.Boom"}]}))
    assert got == "tool config P: tools[0]: tool ? (Boom) failed to start: no schema and no start"


@pytest.mark.parametrize("path, message", [
    (".Boom", "'.Boom' is not a 'module.Class' path"),
    ("Boom.", "'Boom.' is not a 'module.Class' path"),
    ("X.Y", "module 'X' does not import (ModuleNotFoundError: No module named 'X')"),
])
def test_class_paths_are_read_with_dots_at_their_ends_stripped(path, message):
    with pytest.raises(ValueError) as info:
        get_tool_class(path)
    assert str(info.value) == message
