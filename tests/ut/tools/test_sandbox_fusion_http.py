"""ReTool / SandboxFusionTool with sandbox_fusion_url: upstream's request, retries on 504, and the answers
(against a stub server on 127.0.0.1)."""
import asyncio
import socket

import pytest

from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.sandbox_fusion_tool import SandboxFusionTool
from mindspeed_rl.tools.utils import sandbox_fusion


@pytest.fixture(autouse=True)
def no_back_off(monkeypatch):
    monkeypatch.setattr(sandbox_fusion, "RETRY_DELAY_S", 0.0)


def finished(stdout="", stderr="", code=0):
    return {"status": "Success", "run_result": {"status": "Finished", "stdout": stdout, "stderr": stderr,
                                                "return_code": code, "execution_time": 0.01}}


def tool(stub, cls=ReTool, **config):
    return cls({"sandbox_fusion_url": stub.url + "/run_code", "default_timeout": 5, **config}, None
               if cls is ReTool else ReTool.default_tool_schema())


def run(t, **parameters):
    return asyncio.run(t.aexecute("i", parameters))


def test_the_request_is_upstreams_payload(http_stub):
    http_stub.replies.append((200, finished("6\n"), 0))
    out, reward, metrics = run(tool(http_stub, memory_limit_mb=512), code="```python\nx = 2\nx * 3\n```")
    assert (out, reward, metrics["status"], metrics["truncated"]) == ("6\n", 0.0, "ok", False)
    request = http_stub.requests[0]
    assert request["path"] == "/run_code"
    assert request["json"] == {"compile_timeout": 5, "run_timeout": 5, "code": "x = 2\nprint(x * 3)",
                               "stdin": None, "memory_limit_MB": 512, "language": "python", "files": {},
                               "fetch_files": []}
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["Accept"] == "application/json"


def test_a_call_may_name_its_language_and_a_shorter_timeout(http_stub):
    run(tool(http_stub, SandboxFusionTool), code="int main(){}", language="cpp", timeout=2)
    sent = http_stub.requests[0]["json"]
    assert (sent["language"], sent["run_timeout"], sent["compile_timeout"], sent["code"]) == \
        ("cpp", 2, 2, "int main(){}")
    out, _, _ = run(tool(http_stub, SandboxFusionTool), code="x", language="cobol")
    assert out == "error: the sandbox does not run 'cobol'" and len(http_stub.requests) == 1


@pytest.mark.parametrize("answer, text, status", [
    (finished("a\n", "Traceback...\nNameError: y\n", 1), "a\nTraceback...\nNameError: y\n", "error"),
    ({"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "stdout": "", "stderr": ""}},
     "timeout after 5 s", "timeout"),
    ({"status": "SandboxError", "message": "boom"}, "not run: sandbox status SandboxError, run status None",
     "error"),
    ({"status": "Failed", "compile_result": {"status": "Finished", "stderr": "error: expected ';'"},
      "run_result": None}, "not run: sandbox status Failed, run status None\nerror: expected ';'", "error"),
])
def test_each_server_answer_gets_its_text(http_stub, answer, text, status):
    http_stub.replies.append((200, answer, 0))
    out, _, metrics = run(tool(http_stub), code="x = 1")
    assert (out, metrics["status"]) == (text, status)


def test_a_504_is_retried_and_the_answer_then_used(http_stub):
    http_stub.replies += [(504, {}, 0), (504, {}, 0), (200, finished("ok\n"), 0)]
    assert run(tool(http_stub), code="print('ok')")[0] == "ok\n"
    assert len(http_stub.requests) == 3


def test_three_504s_give_up_and_say_so(http_stub):
    http_stub.replies += [(504, {}, 0)] * 4
    out, _, metrics = run(tool(http_stub), code="x = 1")
    assert out == f"sandbox unavailable: HTTP 504 from {http_stub.url}/run_code"
    assert metrics["status"] == "unavailable" and len(http_stub.requests) == 3


def test_other_errors_are_not_retried(http_stub):
    http_stub.replies += [(500, {}, 0), (200, b"<html>", 0)]
    assert run(tool(http_stub), code="x = 1")[0] == f"sandbox unavailable: HTTP 500 from {http_stub.url}/run_code"
    assert run(tool(http_stub), code="x = 1")[0] == \
        f"sandbox unavailable: the answer of {http_stub.url}/run_code is not JSON"
    assert len(http_stub.requests) == 2


def test_a_closed_port_and_a_silent_server_are_answered(http_stub, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends
    t = ReTool({"sandbox_fusion_url": f"http://127.0.0.1:{port}/run_code"}, None)
    out, _, metrics = run(t, code="x = 1")
    assert out.startswith(f"sandbox unavailable: request to http://127.0.0.1:{port}/run_code failed (")
    assert metrics["status"] == "unavailable"
    monkeypatch.setattr(sandbox_fusion, "HTTP_GRACE_S", 0.0)
    http_stub.replies.append((200, finished("late"), 3))
    out, _, _ = run(tool(http_stub), code="x = 1", timeout=0.25)
    assert out == f"sandbox unavailable: no answer from {http_stub.url}/run_code in 0.5 s"


def test_long_server_output_is_cut_to_output_bytes(http_stub):
    http_stub.replies.append((200, finished("é" * 40), 0))
    out, _, metrics = run(tool(http_stub, output_bytes=11), code="x = 1")
    assert out == "é" * 5 + "\n...(output cut at 11 bytes)" and metrics["truncated"] is True
