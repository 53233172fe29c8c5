"""call_search_api on its own (upstream's defaults, no request with max_retries < 1, the back-off between tries and
none after the last, each error's one line) and the answer's text (a document's title and body, non-ASCII kept)."""
import asyncio
import inspect
import json
import socket
from types import SimpleNamespace

from mindspeed_rl.tools.utils import search_api
from mindspeed_rl.tools.utils.search_api import (NO_RESULTS, call_search_api, error_text, passages2string,
                                                 results_text)
from tests.ut.tools.test_search_tool import server_answer


def _call(url, **kw):
    return asyncio.run(call_search_api(url, ["q"], **kw))


def _record_sleeps(monkeypatch):
    slept = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(search_api, "asyncio", SimpleNamespace(sleep=sleep, TimeoutError=asyncio.TimeoutError))
    return slept


def test_upstreams_defaults():
    params = inspect.signature(call_search_api).parameters
    assert {k: params[k].default for k in ("topk", "return_scores", "timeout", "max_retries")} == \
        {"topk": 3, "return_scores": True, "timeout": 30, "max_retries": 10}


def test_the_default_request(http_stub):
    http_stub.replies.append((200, server_answer(["T\nb"]), 0))
    answer, error = _call(http_stub.url + "/retrieve")
    assert error is None and answer == server_answer(["T\nb"])
    assert http_stub.requests[0]["json"] == {"queries": ["q"], "topk": 3, "return_scores": True}


def test_no_retries_means_no_request(http_stub):
    assert _call(http_stub.url + "/retrieve", max_retries=0) == \
        (None, "no request was made (max_retries < 1) (tried 0 times)")
    assert http_stub.requests == []


def test_back_off_grows_between_tries_and_stops_after_the_last(http_stub, monkeypatch):
    slept = _record_sleeps(monkeypatch)
    http_stub.replies += [(503, {}, 0)] * 3
    url = http_stub.url + "/retrieve"
    assert _call(url, max_retries=3) == (None, f"HTTP 503 from {url} (tried 3 times)")
    assert slept == [1.0, 2.0] and len(http_stub.requests) == 3


def test_a_silent_server_and_a_closed_port_each_have_their_line(http_stub, monkeypatch):
    _record_sleeps(monkeypatch)
    http_stub.replies.append((200, server_answer(["late\nx"]), 3))
    url = http_stub.url + "/retrieve"
    assert _call(url, timeout=0.25, max_retries=1) == (None, f"no answer from {url} in 0.25 s (tried 1 times)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    closed = f"http://127.0.0.1:{port}/retrieve"
    assert _call(closed, max_retries=2) == (None, f"request to {closed} failed (ClientConnectorError) (tried 2 times)")


def test_a_document_is_its_first_line_as_title_and_the_rest_as_text():
    hits = [{"document": {"contents": "Title\nline one\nline two"}}, {"document": {"contents": "only a title"}}]
    assert passages2string(hits) == "Doc 1 (Title: Title)\nline one\nline two\n\nDoc 2 (Title: only a title)\n"


def test_answers_keep_non_ascii_text_and_no_query_says_no_results():
    assert error_text("Zürich unreachable") == '{"result": "Zürich unreachable"}'
    assert results_text([[{"document": {"contents": "Zürich\nSee"}}]]) == \
        '{"result": "Doc 1 (Title: Zürich)\\nSee"}'
    assert json.loads(results_text([])) == {"result": NO_RESULTS}


def test_a_request_may_take_30_s_by_default(http_stub, monkeypatch):
    seen, real = [], search_api.aiohttp.ClientTimeout
    monkeypatch.setattr(search_api.aiohttp, "ClientTimeout", lambda total: seen.append(total) or real(total=total))
    http_stub.replies.append((200, server_answer(["T\nb"]), 0))
    assert _call(http_stub.url + "/retrieve")[1] is None
    assert seen == [30]
