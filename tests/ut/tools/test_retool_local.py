"""ReTool / SandboxFusionTool without a server: config checks, the local sandbox's limits and answers."""
import asyncio
import os

import pytest

from mindspeed_rl.tools import sandbox
from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.sandbox import SandboxResult, SandboxUnavailable
from mindspeed_rl.tools.sandbox_fusion_tool import SandboxFusionTool

ALLOW = "MSRL_ALLOW_NO_SANDBOX"


class FakeSandbox:
    """Stands in for run_python_async: records each call, answers with ``result``."""

    def __init__(self, monkeypatch, result=None, error=None):
        self.calls, self.result, self.error = [], result, error
        monkeypatch.setattr(sandbox, "sandbox_problem", lambda: None)
        monkeypatch.setattr(sandbox, "run_python_async", self)

    async def __call__(self, code, limits, stdin=""):
        self.calls.append((code, limits))
        if self.error:
            raise self.error
        return self.result or SandboxResult("out\n", "err\n", 0, "ok", False, 0.25)


def run(tool, **parameters):
    return asyncio.run(tool.aexecute("i", parameters))


def test_config_sets_the_sandbox_limits_and_a_call_may_ask_for_less_time(monkeypatch):
    fake = FakeSandbox(monkeypatch)
    tool = ReTool({"default_timeout": 7, "memory_limit_mb": 256, "max_processes": 4, "output_bytes": 100,
                   "type": "native"}, None)
    assert run(tool, code="1") == ("out\nerr\n", 0.0, {"status": "ok", "wall_seconds": 0.25, "truncated": False})
    run(tool, code="1", timeout=2.5)
    run(tool, code="1", timeout=100)
    limits = [c[1] for c in fake.calls]
    assert [(l.wall_seconds, l.cpu_seconds) for l in limits] == [(7.0, 8), (2.5, 4), (7.0, 8)]
    assert {(l.memory_mb, l.max_processes, l.output_bytes) for l in limits} == {(256, 4, 100)}
    assert fake.calls[0][0] == "print(1)"  # ReTool's tidying reached the sandbox


def test_defaults_are_upstreams(monkeypatch):
    fake = FakeSandbox(monkeypatch)
    tool = SandboxFusionTool({}, ReTool.default_tool_schema())
    run(tool, code="1")
    limits = fake.calls[0][1]
    assert (limits.wall_seconds, limits.cpu_seconds, limits.memory_mb) == (30.0, 31, 1024)
    assert (limits.max_processes, limits.output_bytes) == (16, 65536)
    assert fake.calls[0][0] == "1"  # the base tool runs the code as given
    assert tool.sandbox_fusion_url is None and tool.settings["num_workers"] == 10


@pytest.mark.parametrize("result, text, status", [
    (SandboxResult("1\n", "Traceback...\nValueError: x\n", 1, "error", False, 0.1),
     "1\nTraceback...\nValueError: x\n", "error"),
    (SandboxResult("partial", "", None, "timeout", False, 7.0), "timeout after 7 s", "timeout"),
    (SandboxResult("", "", -9, "killed", False, 1.25), "killed by signal 9 after 1.2 s (limits: 8 s CPU, "
                                                       "1024 MB memory)", "killed"),
])
def test_each_ending_gets_its_answer(monkeypatch, result, text, status):
    FakeSandbox(monkeypatch, result)
    out, reward, metrics = run(ReTool({"default_timeout": 7}, None), code="x = 1")
    assert (out, reward, metrics["status"]) == (text, 0.0, status)


def test_cut_output_is_reported_in_the_metrics(monkeypatch):
    FakeSandbox(monkeypatch, SandboxResult("aaaa[cut]", "", 0, "ok", True, 0.1))
    assert run(ReTool({}, None), code="x = 1")[2]["truncated"] is True


def test_a_sandbox_that_stops_working_gives_an_answer_not_an_exception(monkeypatch):
    FakeSandbox(monkeypatch, error=SandboxUnavailable("sandbox: bwrap vanished"))
    out, _, metrics = run(ReTool({}, None), code="x = 1")
    assert out == "sandbox unavailable: sandbox: bwrap vanished" and metrics["status"] == "unavailable"


@pytest.mark.parametrize("parameters, text", [
    ({}, "error: code_interpreter needs a 'code' argument with the code to run"),
    ({"code": "  \n"}, "error: code_interpreter needs a 'code' argument with the code to run"),
    ({"code": ["x"]}, "error: code_interpreter needs a 'code' argument with the code to run"),
    ({"code": "1", "timeout": "5"}, "error: 'timeout' must be a number of seconds > 0, got '5'"),
    ({"code": "1", "timeout": 0}, "error: 'timeout' must be a number of seconds > 0, got 0"),
    ({"code": "1", "language": "cpp"}, "error: only python runs here, not 'cpp'"),
])
def test_bad_calls_are_answered_without_running(monkeypatch, parameters, text):
    fake = FakeSandbox(monkeypatch)
    out, reward, metrics = run(ReTool({}, None), **parameters)
    assert (out, reward, metrics) == (text, 0.0, {"status": "error", "wall_seconds": 0.0, "truncated": False})
    assert fake.calls == []


@pytest.mark.parametrize("config, message", [
    ({"timeout": 5}, "config key 'timeout' is not known (known: default_language, default_timeout, "
                     "enable_global_rate_limit, max_processes, memory_limit_mb, num_workers, output_bytes, "
                     "rate_limit, sandbox_fusion_url, type)"),
    ({"default_timeout": "30"}, "config default_timeout must be a number, got '30'"),
    ({"default_timeout": True}, "config default_timeout must be a number, got True"),
    ({"memory_limit_mb": 0}, "config memory_limit_mb must be > 0, got 0"),
    ({"num_workers": 2.5}, "config num_workers must be a whole number, got 2.5"),
    ({"enable_global_rate_limit": "yes"}, "config enable_global_rate_limit must be true or false, got 'yes'"),
    ({"default_language": 3}, "config default_language must be a string, got 3"),
    ({"sandbox_fusion_url": 8080}, "config sandbox_fusion_url must be a string, got 8080"),
    ({"type": "mcp"}, "config type 'mcp' is not supported (only 'native')"),
    ({"default_language": "cpp"}, "default_language 'cpp' needs sandbox_fusion_url: the local sandbox runs "
                                  "python only"),
    ({"default_language": "cobol", "sandbox_fusion_url": "http://127.0.0.1:1/run_code"},
     "default_language 'cobol' is not one SandboxFusion runs"),
])
def test_bad_config_is_one_line(monkeypatch, config, message):
    FakeSandbox(monkeypatch)
    with pytest.raises(ValueError) as info:
        ReTool(config, None)
    assert str(info.value) == message


def test_without_a_working_sandbox_the_local_tool_does_not_start_but_a_server_tool_does(monkeypatch):
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: "sandbox: bubblewrap (bwrap) is not on PATH")
    with pytest.raises(ValueError, match=r"^sandbox: bubblewrap \(bwrap\) is not on PATH$"):
        ReTool({}, None)
    assert ReTool({"sandbox_fusion_url": "http://127.0.0.1:1/run_code"}, None).sandbox_fusion_url
    with pytest.raises(ValueError, match="bwrap"):
        ReTool({"sandbox_fusion_url": ""}, None)  # "" means the local sandbox, as None does


@pytest.fixture
def box():
    problem = sandbox.sandbox_problem()
    if problem is not None:
        if os.environ.get(ALLOW) == "1":
            pytest.skip(problem)
        pytest.fail(f"{problem} (set {ALLOW}=1 to skip the sandbox tests)")


def test_real_sandbox_runs_the_models_code(box):
    tool = ReTool({"default_timeout": 20}, None)
    out, _, metrics = run(tool, code="Let me see.\n```python\nimport math\nmath.factorial(5)\n```")
    assert (out, metrics["status"], metrics["truncated"]) == ("120\n", "ok", False)
    assert metrics["wall_seconds"] > 0
    out, _, metrics = run(tool, code="print('before')\n1 / 0")
    assert out.startswith("before\nTraceback") and out.rstrip().endswith("ZeroDivisionError: division by zero")
    assert metrics["status"] == "error"


def test_real_sandbox_stops_a_run_at_the_time_limit_and_cuts_long_output(box):
    tool = ReTool({"default_timeout": 20, "output_bytes": 64}, None)
    out, _, metrics = run(tool, code="while True:\n    pass", timeout=1)
    assert (out, metrics["status"]) == ("timeout after 1 s", "timeout")
    out, _, metrics = run(tool, code="print('x' * 1000)")
    assert metrics["truncated"] is True and out.count("x") == 64


def test_the_built_in_schema_the_model_sees():
    assert ReTool.default_tool_schema().model_dump(exclude_none=True) == {"type": "function", "function": {
        "name": "code_interpreter", "strict": False, "description": "Runs Python code and returns what it prints.",
        "parameters": {"type": "object", "required": ["code"], "properties": {
            "code": {"type": "string", "description": "The Python code to run."}}}}}
