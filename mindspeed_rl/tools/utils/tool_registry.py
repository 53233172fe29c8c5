"""Tools built from a tool config YAML (upstream's format).

    tools:
      - class_name: mindspeed_rl.tools.retool.ReTool   # module path + class, a BaseTool subclass
        config: {type: native, ...}                    # handed to the class; type: only 'native'
        tool_schema: {type: function, function: ...}   # optional when the class has a default schema

Every problem is one ValueError line naming the file, the entry (``tools[i]``, and the tool's name once known)
and the field."""
import importlib
import os
from typing import Dict, List

import yaml
from pydantic import ValidationError

from mindspeed_rl.tools.base_tool import BaseTool, schema_problem
from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema
from mindspeed_rl.tools.utils.tool_config import type_problem

ENTRY_KEYS = ("class_name", "config", "tool_schema")


def get_tool_class(cls_name: str) -> type:
    """The class named by ``package.module.Class``; ValueError naming the module or attribute that failed."""
    if not isinstance(cls_name, str) or "." not in cls_name.strip("."):
        raise ValueError(f"{cls_name!r} is not a 'module.Class' path")
    module_name, attr = cls_name.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or any error raised while the module runs
        raise ValueError(f"module {module_name!r} does not import ({type(e).__name__}: {_one_line(e)})") from None
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)


def _one_line(error) -> str:
    return " ".join(str(error).split())


def _pydantic_line(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in error.errors())


def _read(path: str) -> list:
    where = f"tool config {path}"
    if not os.path.isfile(path):
        raise ValueError(f"{where}: file not found")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML ({_one_line(e)})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping with a 'tools' list, got {type(data).__name__}")
    tools = data.get("tools")
    if not isinstance(tools, list) or not tools:
        raise ValueError(f"{where}: 'tools' must be a non-empty list of tool entries")
    return tools


def _build(path: str, index: int, entry) -> BaseTool:
    where = f"tool config {path}: tools[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a mapping with keys {', '.join(ENTRY_KEYS)}")
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(ENTRY_KEYS)})")
    schema = None
    if entry.get("tool_schema") is not None:
        try:
            schema = OpenAIFunctionToolSchema.model_validate(entry["tool_schema"])
        except ValidationError as e:
            raise ValueError(f"{where}.tool_schema is not valid: {_pydantic_line(e)}") from None
        where += f" ({schema.function.name})"
    if "class_name" not in entry:
        raise ValueError(f"{where}.class_name is missing")
    try:
        cls = get_tool_class(entry["class_name"])
    except ValueError as e:
        raise ValueError(f"{where}.class_name: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ValueError(f"{where}.class_name: {entry['class_name']} is not a BaseTool subclass")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{where}.config must be a mapping, got {type(config).__name__}")
    problem = type_problem(config.get("type", "native"))
    if problem:
        raise ValueError(f"{where}.config.{problem}")
    try:
        tool = cls(config=dict(config), tool_schema=schema)
    except Exception as e:
        default = None if schema else cls.default_tool_schema()
        name = (schema or default).function.name if (schema or default) else "?"
        raise ValueError(f"{where}: tool {name} ({cls.__name__}) failed to start: {_one_line(e)}") from None
    problem = schema_problem(tool)
    if problem:
        raise ValueError(f"tool config {path}: tools[{index}]: {problem}")
    return tool


def initialize_tools_from_config(tools_config_file: str) -> List[BaseTool]:
    """The tools of ``tools_config_file``, in file order."""
    tools = [_build(tools_config_file, i, entry) for i, entry in enumerate(_read(tools_config_file))]
    seen: Dict[str, int] = {}
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise ValueError(f"tool config {tools_config_file}: tools[{i}] ({tool.name}): the name is already "
                             f"used by tools[{seen[tool.name]}]")
        seen[tool.name] = i
    return tools


def tools_by_name(tools: List[BaseTool]) -> Dict[str, BaseTool]:
    """``{tool.name: tool}``; two tools with one name raise ValueError."""
    out: Dict[str, BaseTool] = {}
    for tool in tools:
        if tool.name in out:
            raise ValueError(f"two tools are named {tool.name!r}: {type(out[tool.name]).__name__} and "
                             f"{type(tool).__name__}")
        out[tool.name] = tool
    return out
