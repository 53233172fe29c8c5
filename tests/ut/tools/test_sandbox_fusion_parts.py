"""SandboxFusionTool's edges (with ReTool's schema: the class has none of its own): a kill without a signal, the
metrics of an unavailable sandbox, output of exactly output_bytes, the default language of a direct run, the
remote run's metrics, the shared limit switched off."""
import asyncio

from mindspeed_rl.tools.sandbox import SandboxResult, SandboxUnavailable
from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.sandbox_fusion_tool import SandboxFusionTool
from mindspeed_rl.tools.utils import concurrency
from tests.ut.tools.test_retool_local import FakeSandbox, run
from tests.ut.tools.test_sandbox_fusion_http import finished


def _tool(config):
    return SandboxFusionTool(config, ReTool.default_tool_schema())


def test_a_kill_without_a_signal_says_killed(monkeypatch):
    FakeSandbox(monkeypatch, SandboxResult("", "", None, "killed", False, 2.0))
    out, _, metrics = run(_tool({"default_timeout": 3}), code="x = 1")
    assert out == "killed after 2.0 s (limits: 4 s CPU, 1024 MB memory)" and metrics["status"] == "killed"


def test_an_unavailable_sandbox_has_its_metrics(monkeypatch):
    FakeSandbox(monkeypatch, error=SandboxUnavailable("gone"))
    out, reward, metrics = run(_tool({}), code="x = 1")
    assert (out, reward) == ("sandbox unavailable: gone", 0.0)
    assert metrics == {"status": "unavailable", "wall_seconds": 0.0, "truncated": False}


def _remote(stub, **config):
    return _tool({"sandbox_fusion_url": stub.url + "/run_code", **config})


def test_output_of_exactly_output_bytes_is_whole(http_stub):
    http_stub.replies += [(200, finished("abcd"), 0), (200, finished("abcde"), 0)]
    out, _, metrics = run(_remote(http_stub, output_bytes=4), code="x = 1")
    assert (out, metrics["truncated"]) == ("abcd", False)
    out, _, metrics = run(_remote(http_stub, output_bytes=4), code="x = 1")
    assert (out, metrics["truncated"]) == ("abcd\n...(output cut at 4 bytes)", True)
    assert set(metrics) == {"status", "wall_seconds", "truncated"} and 0.0 <= metrics["wall_seconds"] < 300.0


def test_a_direct_run_is_python_unless_told(http_stub):
    http_stub.replies.append((200, finished("1"), 0))
    text, metrics = asyncio.run(_remote(http_stub).run_code("print(1)", 5))
    assert (text, metrics["status"]) == ("1", "ok")
    assert http_stub.requests[0]["json"]["language"] == "python"


def test_the_shared_limit_can_be_switched_off(monkeypatch):
    FakeSandbox(monkeypatch)
    monkeypatch.setattr(concurrency, "_GLOBAL", {})
    assert _tool({"enable_global_rate_limit": False})._shared is None
    assert concurrency._GLOBAL == {}
    assert _tool({})._shared is concurrency._GLOBAL["limit"]
