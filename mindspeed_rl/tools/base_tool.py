"""``BaseTool``: upstream's tool interface, plus awaitable ``acreate`` / ``aexecute`` / ``arelease``.

A subclass implements ``create`` / ``execute`` / ``release`` either synchronously (upstream's style: run in a
thread by the ``a*`` methods) or as ``async def`` (verl's style: awaited). ``execute`` returns
``(text, reward, metrics)``; ``aexecute`` also takes verl's ``ToolResponse`` for the text and ``None`` for the
reward (0.0) or the metrics ({})."""
import asyncio
import inspect
import uuid
from typing import Any, Dict, FrozenSet, Optional, Tuple

from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse


async def _call(fn, *args, **kwargs):
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result


class BaseTool:
    # argument names ``execute`` reads (None: not declared); ``schema_problem`` checks the schema against it
    parameters: Optional[FrozenSet[str]] = None

    def __init__(self, config: dict, tool_schema: Optional[OpenAIFunctionToolSchema]):
        self.config = dict(config or {})
        self.tool_schema = tool_schema or self.default_tool_schema()
        if self.tool_schema is None:
            self.tool_schema = self.get_openai_tool_schema()  # upstream's hook for a built-in schema
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__} has no tool_schema: give one in the tool config")
        self.name = self.tool_schema.function.name

    @property
    def label(self) -> str:
        """``tool <name> (<class>)`` for messages."""
        return f"tool {self.name} ({type(self).__name__})"

    @classmethod
    def default_tool_schema(cls) -> Optional[OpenAIFunctionToolSchema]:
        """The schema used when the tool config gives none."""
        return None

    def get_openai_tool_schema(self) -> Optional[OpenAIFunctionToolSchema]:
        return self.tool_schema

    def create(self, instance_id: Optional[str] = None, **kwargs) -> str:
        """Starts one trajectory's use of the tool; returns its instance id."""
        return instance_id if instance_id is not None else str(uuid.uuid4())

    def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs) -> Tuple[str, float, dict]:
        return f"{self.label} does not implement execute", 0.0, {}

    def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    def release(self, instance_id: str, **kwargs) -> None:
        return None

    async def acreate(self, instance_id: Optional[str] = None, **kwargs) -> str:
        created = await _call(self.create, instance_id, **kwargs)
        return created[0] if isinstance(created, tuple) else created  # verl: (id, ToolResponse)

    async def aexecute(self, instance_id: str, parameters: Dict[str, Any], **kwargs) -> Tuple[str, float, dict]:
        result = await _call(self.execute, instance_id, parameters, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 3):
            raise TypeError(f"{self.label}: execute returned {type(result).__name__}, "
                            "expected (text, reward, metrics)")
        text, reward, metrics = result
        if isinstance(text, ToolResponse):
            text = text.text or ""
        if not isinstance(text, str):
            raise TypeError(f"{self.label}: execute returned a {type(text).__name__} as its text, expected str")
        return text, float(reward or 0.0), dict(metrics or {})

    async def arelease(self, instance_id: str, **kwargs) -> None:
        await _call(self.release, instance_id, **kwargs)


def schema_problem(tool: BaseTool) -> Optional[str]:
    """One line when the tool's schema asks for arguments the tool does not take, else None."""
    params = tool.tool_schema.function.parameters
    for name in params.required:
        if name not in params.properties:
            return f"{tool.label}: the schema requires {name!r} but has no property {name!r}"
    if tool.parameters is None:
        return None
    accepted = ", ".join(map(repr, sorted(tool.parameters)))
    for name in list(params.required) + sorted(params.properties):
        if name not in tool.parameters:
            return f"{tool.label}: the schema names the argument {name!r} but the tool reads only {accepted}"
    return None
