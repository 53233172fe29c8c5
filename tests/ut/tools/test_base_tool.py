"""BaseTool: upstream-style (sync) and verl-style (async) tools both work through acreate/aexecute/arelease;
schema_problem names a schema that asks for arguments the tool does not read."""
import asyncio
import subprocess
import sys
import threading

import pytest

from mindspeed_rl.tools.base_tool import BaseTool, schema_problem
from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


def _schema(name="echo", required=("text",), properties=("text",)):
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": name, "description": "d", "parameters": {
            "type": "object", "required": list(required),
            "properties": {p: {"type": "string"} for p in properties}}}})


class SyncTool(BaseTool):
    """Upstream's style: plain methods."""

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.threads, self.released = [], []

    def execute(self, instance_id, parameters, **kwargs):
        self.threads.append(threading.get_ident())
        return f"{instance_id}:{parameters['text']}", 0.5, {"n": 1}

    def release(self, instance_id, **kwargs):
        self.threads.append(threading.get_ident())
        self.released.append(instance_id)


class AsyncTool(BaseTool):
    """verl's style: coroutines, ToolResponse text, None reward."""

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.released = []

    async def create(self, instance_id=None, **kwargs):
        return "made-" + kwargs["seed"], ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=parameters["text"].upper()), None, None

    async def release(self, instance_id, **kwargs):
        self.released.append(instance_id)


def test_a_sync_tool_runs_off_the_event_loop_thread():
    tool = SyncTool({}, _schema())

    async def go():
        loop_thread = threading.get_ident()
        out = await tool.aexecute("i1", {"text": "hi"})
        await tool.arelease("i1")
        return loop_thread, out

    loop_thread, out = asyncio.run(go())
    assert out == ("i1:hi", 0.5, {"n": 1})
    assert tool.released == ["i1"]
    assert len(tool.threads) == 2 and loop_thread not in tool.threads


def test_an_async_tool_is_awaited_and_its_verl_answers_are_normalised():
    tool = AsyncTool({}, _schema())

    async def go():
        instance = await tool.acreate(seed="7")
        out = await tool.aexecute(instance, {"text": "hi"})
        await tool.arelease(instance)
        return instance, out

    instance, out = asyncio.run(go())
    assert instance == "made-7"
    assert out == ("HI", 0.0, {})
    assert tool.released == ["made-7"]


def test_create_gives_a_fresh_id_or_keeps_the_given_one():
    tool = BaseTool({}, _schema())
    first, second = asyncio.run(tool.acreate()), asyncio.run(tool.acreate())
    assert isinstance(first, str) and len(first) == 36 and first != second
    assert asyncio.run(tool.acreate("mine")) == "mine"


def test_base_execute_says_it_is_not_implemented_and_rewards_nothing():
    tool = BaseTool({"k": 1}, _schema(name="noop"))
    text, reward, metrics = asyncio.run(tool.aexecute("i", {}))
    assert text == "tool noop (BaseTool) does not implement execute" and (reward, metrics) == (0.0, {})
    assert tool.calc_reward("i") == 0.0 and tool.config == {"k": 1} and tool.name == "noop"


def test_an_execute_with_a_wrong_answer_shape_is_named():
    class Bad(BaseTool):
        def execute(self, instance_id, parameters, **kwargs):
            return "only text"

    with pytest.raises(TypeError, match=r"^tool echo \(Bad\): execute returned str, expected \(text, reward, "
                                        r"metrics\)$"):
        asyncio.run(Bad({}, _schema()).aexecute("i", {}))

    class NotText(BaseTool):
        def execute(self, instance_id, parameters, **kwargs):
            return 42, 0.0, {}

    with pytest.raises(TypeError, match=r"returned a int as its text"):
        asyncio.run(NotText({}, _schema()).aexecute("i", {}))


def test_the_schema_comes_from_the_config_the_class_default_or_the_upstream_hook():
    class WithDefault(BaseTool):
        @classmethod
        def default_tool_schema(cls):
            return _schema(name="builtin")

    class WithHook(BaseTool):
        def get_openai_tool_schema(self):
            return _schema(name="hooked")

    assert WithDefault({}, None).name == "builtin"
    assert WithDefault({}, _schema(name="given")).name == "given"
    assert WithHook({}, None).name == "hooked"
    with pytest.raises(ValueError, match="^BaseTool has no tool_schema: give one in the tool config$"):
        BaseTool({}, None)


class Coder(BaseTool):
    parameters = frozenset({"code", "timeout"})


@pytest.mark.parametrize("required, properties, problem", [
    (("code",), ("code", "timeout"), None),
    (("code",), ("code",), None),
    (("code",), (), "tool run (Coder): the schema requires 'code' but has no property 'code'"),
    (("cmd",), ("cmd",), "tool run (Coder): the schema names the argument 'cmd' but the tool reads only "
                         "'code', 'timeout'"),
    (("code",), ("code", "lang"), "tool run (Coder): the schema names the argument 'lang' but the tool reads "
                                  "only 'code', 'timeout'"),
])
def test_schema_problem_names_arguments_the_tool_does_not_read(required, properties, problem):
    assert schema_problem(Coder({}, _schema("run", required, properties))) == problem


def test_a_tool_that_declares_no_parameters_takes_any_schema_that_is_consistent():
    assert schema_problem(BaseTool({}, _schema("any", ("x",), ("x", "y")))) is None
    assert "has no property 'x'" in schema_problem(BaseTool({}, _schema("any", ("x",), ("y",))))


def test_the_tool_interface_imports_without_ray_or_torch():
    code = ("import sys; import mindspeed_rl.tools.base_tool, mindspeed_rl.tools.utils.tool_registry, "
            "mindspeed_rl.tools.utils.tool_parser, mindspeed_rl.tools.utils.truncate; "
            "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
