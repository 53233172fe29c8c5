"""Tool calls read from the model's text: ``ToolParser`` registry, ``HermesToolParser`` ('hermes').

Hermes format (Qwen2.5): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any whitespace around the
JSON. ``parse_text`` also returns one line per malformed block, for the agent loop to answer the model with."""
import json
import logging
import re
from abc import ABC, abstractmethod
from typing import Callable, Dict, List, Tuple

from mindspeed_rl.tools.schemas import OpenAIFunctionParsedSchema

logger = logging.getLogger(__name__)


class ToolParser(ABC):
    _registry: Dict[str, type] = {}

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def register(cls, name: str) -> Callable[[type], type]:
        def decorator(subclass: type) -> type:
            cls._registry[name] = subclass
            return subclass
        return decorator

    @classmethod
    def known(cls) -> tuple:
        """The registered format names (tool_parser_format's values)."""
        return tuple(sorted(cls._registry))

    @classmethod
    def get_tool_parser(cls, name: str, tokenizer) -> "ToolParser":
        if name not in cls._registry:
            from mindspeed_rl.algorithms.registry import did_you_mean  # only here: it imports torch
            known = sorted(cls._registry)
            raise ValueError(f"unknown tool parser {name!r}{did_you_mean(name, known)}; "
                             f"known: {', '.join(known)}")
        return cls._registry[name](tokenizer)

    @abstractmethod
    def extract_tool_calls(self, responses_ids: List[int]) -> List[OpenAIFunctionParsedSchema]:
        """The calls in one generated turn (token ids)."""


@ToolParser.register("hermes")
class HermesToolParser(ToolParser):
    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.pattern = re.compile(re.escape(self.open_tag) + r"(.*?)" + re.escape(self.close_tag), re.DOTALL)

    def extract_tool_calls(self, responses_ids: List[int]) -> List[OpenAIFunctionParsedSchema]:
        calls, errors = self.parse_text(self.tokenizer.decode(responses_ids))
        for error in errors:
            logger.warning("malformed tool call skipped: %s", error)
        return calls

    def parse_text(self, text: str) -> Tuple[List[OpenAIFunctionParsedSchema], List[str]]:
        """``(calls, errors)``: each well-formed block becomes a call, each malformed one an error line."""
        calls: List[OpenAIFunctionParsedSchema] = []
        errors: List[str] = []
        end = 0
        for number, match in enumerate(self.pattern.finditer(text), start=1):
            end = match.end()
            call = _parse_block(match.group(1))
            if isinstance(call, tuple):
                name, problem = call
                errors.append(f"tool call {number}{f' ({name})' if name else ''}: {problem}")
            else:
                calls.append(call)
        if self.open_tag in text[end:]:
            errors.append(f"tool call {len(calls) + len(errors) + 1}: {self.open_tag} is not closed "
                          f"by {self.close_tag}")
        return calls, errors


def _json_type(value) -> str:
    """The JSON name of a decoded value that is not an object (the callers handle objects)."""
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}[type(value)]


def _parse_block(body: str):
    """An ``OpenAIFunctionParsedSchema``, or ``(name or None, problem)``."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        return None, f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    if not isinstance(data, dict):
        return None, f'expected a JSON object with "name" and "arguments", got {_json_type(data)}'
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return None, '"name" is missing' if name is None else '"name" must be a non-empty string'
    if "arguments" not in data:
        return name, '"arguments" is missing'
    arguments = data["arguments"]
    if not isinstance(arguments, dict):
        return name, f'"arguments" must be a JSON object, got {_json_type(arguments)}'
    return OpenAIFunctionParsedSchema(name=name, arguments=json.dumps(arguments, ensure_ascii=False))
