"""The toy tool task's tool (datasets/toy_tasks.py, task 'tool'): ``secret`` answers with the row's label, given
to every tool of a conversation as ``ground_truth`` when it starts, so only a model that calls it can know it."""
import itertools
import time
from typing import Any, Dict, Optional

from mindspeed_rl.tools.base_tool import BaseTool
from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema, function_tool_schema


class SecretTool(BaseTool):
    parameters = frozenset()

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        super().__init__(config, tool_schema)
        self._truth: Dict[str, str] = {}

    @classmethod
    def default_tool_schema(cls) -> OpenAIFunctionToolSchema:
        return function_tool_schema("secret", "Tells the secret digit of this conversation.")

    def create(self, instance_id: Optional[str] = None, ground_truth: Optional[str] = None, **kwargs) -> str:
        instance_id = super().create(instance_id)
        self._truth[instance_id] = "" if ground_truth is None else str(ground_truth)
        return instance_id

    def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs):
        if instance_id not in self._truth:
            return "error: the conversation was not started with its ground truth", 0.0, {}
        return self._truth[instance_id], 0.0, {}

    def release(self, instance_id: str, **kwargs) -> None:
        self._truth.pop(instance_id, None)


class FaultyTool(SecretTool):
    """A fault drill for the tool loop: its calls, in turn, hang (``hang_seconds``, past any sane
    tool_call_timeout), raise, answer ``flood_chars`` characters, or answer like SecretTool. Named 'secret' in a
    tool YAML it stands in for the toy task's tool; the run must go on through all of it."""

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema] = None):
        super().__init__(config, tool_schema)
        self.hang_seconds = float(config.get("hang_seconds", 30.0))
        self.flood_chars = int(config.get("flood_chars", 2_000_000))
        self._calls = itertools.count()

    @classmethod
    def default_tool_schema(cls) -> OpenAIFunctionToolSchema:
        return function_tool_schema("faulty", "Hangs, raises, floods or answers, in turn.")

    def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs):
        kind = next(self._calls) % 4
        if kind == 0:
            time.sleep(self.hang_seconds)
        if kind == 1:
            raise RuntimeError("the faulty tool failed on purpose")
        if kind == 2:
            return "9" * self.flood_chars, 0.0, {}
        return super().execute(instance_id, parameters, **kwargs)
