"""BaseTool's a* methods pass keyword arguments on, await what a plain method hands back, and name a wrong
answer shape; a ToolResponse without text is an empty answer."""
import asyncio

import pytest

from mindspeed_rl.tools.base_tool import BaseTool
from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


def _schema():
    return OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": "echo", "description": "d", "parameters": {"type": "object", "required": [], "properties": {}}}})


class KwargsTool(BaseTool):
    """Plain methods that record the keyword arguments they get."""

    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.seen = []

    def execute(self, instance_id, parameters, **kwargs):
        self.seen.append(("execute", kwargs))
        return "ok", 1.0, {}

    def release(self, instance_id, **kwargs):
        self.seen.append(("release", kwargs))


def test_keyword_arguments_reach_a_plain_execute_and_release():
    tool = KwargsTool({}, _schema())

    async def go():
        out = await tool.aexecute("i", {}, agent="a1", turn=2)
        await tool.arelease("i", reason="done")
        return out

    assert asyncio.run(go()) == ("ok", 1.0, {})
    assert tool.seen == [("execute", {"agent": "a1", "turn": 2}), ("release", {"reason": "done"})]


def test_a_plain_execute_that_hands_back_an_awaitable_is_awaited():
    class Deferred(BaseTool):
        async def _answer(self, instance_id):
            return f"late {instance_id}", 0.25, {"k": 1}

        def execute(self, instance_id, parameters, **kwargs):
            return self._answer(instance_id)

    assert asyncio.run(Deferred({}, _schema()).aexecute("i", {})) == ("late i", 0.25, {"k": 1})


@pytest.mark.parametrize("answer, kind", [(("text", 1.0), "tuple"), ("abc", "str"), (["a", 0.0, {}], "list")])
def test_an_answer_that_is_no_three_tuple_is_named(answer, kind):
    class Bad(BaseTool):
        def execute(self, instance_id, parameters, **kwargs):
            return answer

    with pytest.raises(TypeError, match=rf"^tool echo \(Bad\): execute returned {kind}, expected \(text, reward, "
                                        r"metrics\)$"):
        asyncio.run(Bad({}, _schema()).aexecute("i", {}))


def test_a_tool_response_without_text_is_an_empty_answer():
    class Silent(BaseTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(), None, None

    assert asyncio.run(Silent({}, _schema()).aexecute("i", {})) == ("", 0.0, {})
