"""call_sandbox_api on its own: the default language, no request with max_retries < 1, the back-off after each
504, the deadline of a request, a failed connection's one line, and a finished run's missing fields."""
import asyncio
import re
import socket
from types import SimpleNamespace

from mindspeed_rl.tools.utils import sandbox_fusion
from mindspeed_rl.tools.utils.sandbox_fusion import call_sandbox_api, fusion_outcome
from tests.ut.tools.test_sandbox_fusion_http import finished


def _call(url, **kw):
    args = dict(code="x = 1", stdin=None, compile_timeout=5, run_timeout=5, memory_limit_mb=64)
    args.update(kw)
    return asyncio.run(call_sandbox_api(url, **args))


def test_python_is_the_default_language(http_stub):
    http_stub.replies.append((200, finished("1"), 0))
    answer, error = _call(http_stub.url + "/run_code")
    assert error is None and answer["run_result"]["stdout"] == "1"
    assert http_stub.requests[0]["json"]["language"] == "python"


def test_no_retries_means_no_request(http_stub):
    assert _call(http_stub.url + "/run_code", max_retries=0) == (None, "no request was made (max_retries < 1)")
    assert http_stub.requests == []


def test_each_504_backs_off_longer(http_stub, monkeypatch):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(sandbox_fusion, "asyncio", SimpleNamespace(sleep=sleep, TimeoutError=asyncio.TimeoutError))
    http_stub.replies += [(504, {}, 0), (504, {}, 0), (200, finished("ok"), 0)]
    answer, error = _call(http_stub.url + "/run_code", max_retries=3)
    assert error is None and answer["run_result"]["stdout"] == "ok"
    assert slept == [sandbox_fusion.RETRY_DELAY_S * 1, sandbox_fusion.RETRY_DELAY_S * 2] == [1.0, 2.0]


def test_a_request_may_take_both_timeouts_and_the_grace(http_stub, monkeypatch):
    monkeypatch.setattr(sandbox_fusion, "HTTP_GRACE_S", 0.25)
    http_stub.replies.append((200, finished("late"), 5))
    url = http_stub.url + "/run_code"
    assert _call(url, compile_timeout=0.25, run_timeout=0.25) == (None, f"no answer from {url} in 0.75 s")


def test_a_closed_port_is_one_line_naming_the_error_type():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/run_code"
    answer, error = _call(url)
    assert answer is None
    assert re.fullmatch(rf"request to {re.escape(url)} failed \(ClientConnectorError: Cannot connect to host "
                        rf"127\.0\.0\.1:{port} \S.*\)", error), error
    assert "\n" not in error and "  " not in error


def test_a_finished_run_without_stdout_or_return_code_is_ok():
    assert fusion_outcome({"run_result": {"status": "Finished", "stdout": None, "stderr": "warn"}}, None, 5) == \
        ("warn", "ok")
    assert fusion_outcome({"run_result": {"status": "Finished", "stdout": "a", "stderr": None,
                                          "return_code": 2}}, None, 5) == ("a", "error")
