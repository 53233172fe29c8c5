"""The shipped tool configs and upstream's two tool configs load; upstream's server URLs are only used
when a call runs."""
import asyncio
import json
import os

import aiohttp
import pytest

from mindspeed_rl.tools import sandbox
from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.search_tool import SearchTool
from mindspeed_rl.tools.utils.tool_registry import initialize_tools_from_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
UPSTREAM = os.path.join(ROOT, "tests", "data", "upstream_configs", "05a90d7", "configs", "tools")


@pytest.fixture
def no_requests(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a request was made while the tools were built")
    monkeypatch.setattr(aiohttp, "ClientSession", refuse)


def test_our_retool_config_runs_locally(monkeypatch, no_requests):
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: None)
    [tool] = initialize_tools_from_config(os.path.join(ROOT, "configs", "tools", "retool_config.yaml"))
    assert isinstance(tool, ReTool) and tool.name == "code_interpreter"
    assert tool.sandbox_fusion_url is None and tool.settings["default_timeout"] == 30
    assert tool.tool_schema.function.parameters.required == ["code"]


def test_our_search_config_searches_its_sample_corpus(monkeypatch, no_requests):
    monkeypatch.chdir(ROOT)
    [tool] = initialize_tools_from_config("configs/tools/search_tool_config.yaml")
    assert isinstance(tool, SearchTool) and tool.name == "search" and tool.retrieval_service_url is None
    text, _, metrics = asyncio.run(tool.aexecute("i", {"query_list": ["capital of France"]}))
    assert json.loads(text)["result"].startswith("Doc 1 (Title: Paris)\n")
    assert metrics["total_results"] >= 1


def test_upstreams_retool_config_loads_without_contacting_its_server(no_requests):
    [tool] = initialize_tools_from_config(os.path.join(UPSTREAM, "retool_config.yaml"))
    assert isinstance(tool, ReTool) and tool.name == "code_interpreter"
    assert tool.sandbox_fusion_url == "http://localhost:8080/run_code"
    assert (tool.settings["num_workers"], tool.settings["rate_limit"], tool.settings["memory_limit_mb"]) == \
        (128, 128, 1024)


def test_upstreams_search_config_loads_without_contacting_its_server(no_requests):
    [tool] = initialize_tools_from_config(os.path.join(UPSTREAM, "search_tool_config.yaml"))
    assert isinstance(tool, SearchTool) and tool.name == "search"
    assert tool.retrieval_service_url == "http://localhost:8080/retrieve" and tool.settings["topk"] == 3
