"""SearchTool: a local BM25 corpus or a retrieval server (stub on 127.0.0.1), upstream's answer text."""
import asyncio
import json
import socket
import sys

import pytest

from mindspeed_rl.tools.search_tool import SearchTool
from mindspeed_rl.tools.utils import search_api

DOCS = [("Paris", "Paris is the capital of France."), ("Berlin", "Berlin is the capital of Germany."),
        ("Zürich", "Zürich is a city in Switzerland on a lake."), ("Cats", "Cats are small furry animals.")]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": f"{t}\n{b}"}, ensure_ascii=False) + "\n"
                            for i, (t, b) in enumerate(DOCS)) + "\n", encoding="utf-8")
    return str(path)


@pytest.fixture(autouse=True)
def no_back_off(monkeypatch):
    monkeypatch.setattr(search_api, "RETRY_DELAY_S", 0.0)


def search(tool, parameters):
    return asyncio.run(tool.aexecute("i", parameters))


def result(text):
    return json.loads(text)["result"]


def test_a_local_corpus_answers_in_upstreams_format(corpus):
    tool = SearchTool({"corpus_path": corpus, "topk": 2}, None)
    text, reward, metrics = search(tool, {"query_list": ["capital of France", "lake city"]})
    assert result(text) == ("Doc 1 (Title: Paris)\nParis is the capital of France.\n\n"
                            "Doc 2 (Title: Berlin)\nBerlin is the capital of Germany.\n---\n"
                            "Doc 1 (Title: Zürich)\nZürich is a city in Switzerland on a lake.")
    assert "Zürich" in text and reward == 0.0  # JSON without \\u escapes
    assert metrics["query_count"] == 2 and metrics["total_results"] == 3
    assert (metrics["status"], metrics["api_request_error"]) == ("ok", None)


def test_topk_bounds_the_documents_and_unmatched_queries_say_so(corpus):
    tool = SearchTool({"corpus_path": corpus, "topk": 1}, None)
    assert result(search(tool, {"query_list": ["capital"]})[0]).count("Doc ") == 1
    assert result(search(tool, {"query_list": ["quantum chromodynamics", "cats"]})[0]) == \
        "No search results found.\n---\nDoc 1 (Title: Cats)\nCats are small furry animals."
    big = SearchTool({"corpus_path": corpus, "topk": 50}, None)  # more than the corpus holds
    assert result(search(big, {"query_list": ["capital"]})[0]).count("Doc ") == 2


@pytest.mark.parametrize("parameters", [{}, {"query_list": "paris"}, {"query_list": []},
                                        {"query_list": ["paris", 3]}])
def test_a_bad_query_list_is_answered_as_upstream(corpus, parameters):
    text, reward, metrics = search(SearchTool({"corpus_path": corpus}, None), parameters)
    assert result(text) == "Error: 'query_list' is missing, empty, or not a list of strings."
    assert (reward, metrics) == (0.0, {})


@pytest.mark.parametrize("content, message", [
    (None, "corpus_path P: cannot be read (No such file or directory)"),
    ('{"id": "1", "contents": "a\\nb"}\n{"id": 2,\n', "corpus_path P line 2: not valid JSON (Expecting "
                                                      "property name enclosed in double quotes)"),
    ('{"id": "1", "text": "a"}\n', "corpus_path P line 1: needs a string 'contents'"),
    ('["a"]\n', "corpus_path P line 1: needs a string 'contents'"),
    ("\n\n", "corpus_path P: holds no documents"),
])
def test_a_bad_corpus_is_one_line(tmp_path, content, message):
    path = tmp_path / "c.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError) as info:
        SearchTool({"corpus_path": str(path)}, None)
    assert str(info.value).replace(str(path), "P") == message


@pytest.mark.parametrize("config", [{}, {"corpus_path": "c.jsonl", "retrieval_service_url": "http://127.0.0.1:1"},
                                    {"retrieval_service_url": ""}])
def test_exactly_one_source_is_set(config):
    with pytest.raises(ValueError, match=r"^set exactly one of retrieval_service_url \(a retrieval server\) and "
                                         r"corpus_path \(a local JSONL corpus\)$"):
        SearchTool(config, None)


def test_a_missing_bm25s_names_the_extra(corpus, monkeypatch):
    monkeypatch.setitem(sys.modules, "bm25s", None)
    with pytest.raises(ValueError, match=r"^corpus_path needs the bm25s package: pip install "
                                         r"'mindspeed_rl\[agent\]'$"):
        SearchTool({"corpus_path": corpus}, None)


def test_unknown_config_keys_are_refused(corpus):
    with pytest.raises(ValueError, match=r"^config key 'top_k' is not known \(known: corpus_path, "
                                         r"enable_global_rate_limit, num_workers, rate_limit, "
                                         r"retrieval_service_url, timeout, topk, type\)$"):
        SearchTool({"corpus_path": corpus, "top_k": 2}, None)


def server_answer(*per_query):
    return {"result": [[{"document": {"id": "x", "contents": c}, "score": 1.0} for c in hits]
                       for hits in per_query]}


def test_a_server_gets_upstreams_request_and_its_answer_is_formatted(http_stub):
    http_stub.replies.append((200, server_answer(["T1\nbody one", "T2\nbody two"], []), 0))
    tool = SearchTool({"retrieval_service_url": http_stub.url + "/retrieve", "topk": 2}, None)
    text, _, metrics = search(tool, {"query_list": ["q1", "q2"]})
    assert http_stub.requests[0]["path"] == "/retrieve"
    assert http_stub.requests[0]["json"] == {"queries": ["q1", "q2"], "topk": 2, "return_scores": True}
    assert result(text) == "Doc 1 (Title: T1)\nbody one\n\nDoc 2 (Title: T2)\nbody two\n---\n" \
                           "No search results found."
    assert (metrics["total_results"], metrics["status"]) == (2, "ok")


def test_server_errors_are_retried_as_upstream_then_reported(http_stub):
    url = http_stub.url + "/retrieve"
    tool = SearchTool({"retrieval_service_url": url}, None)
    http_stub.replies += [(503, {}, 0), (502, {}, 0), (200, server_answer(["T\nb"]), 0)]
    assert result(search(tool, {"query_list": ["q"]})[0]) == "Doc 1 (Title: T)\nb"
    assert len(http_stub.requests) == 3
    http_stub.replies += [(500, {}, 0)] * 10
    text, _, metrics = search(tool, {"query_list": ["q"]})
    assert result(text) == f"Search error: HTTP 500 from {url} (tried 10 times)"
    assert (metrics["status"], metrics["api_request_error"]) == ("error", f"HTTP 500 from {url} (tried 10 times)")
    assert len(http_stub.requests) == 13
    http_stub.replies.append((404, {}, 0))
    assert result(search(tool, {"query_list": ["q"]})[0]) == f"Search error: HTTP 404 from {url}"
    assert len(http_stub.requests) == 14


def test_a_malformed_or_slow_answer_is_reported(http_stub):
    url = http_stub.url + "/retrieve"
    tool = SearchTool({"retrieval_service_url": url, "timeout": 0.3}, None)
    http_stub.replies.append((200, {"result": "none"}, 0))
    assert result(search(tool, {"query_list": ["q"]})[0]) == \
        "Search error: the answer has no 'result' list of documents per query"
    http_stub.replies += [(200, server_answer(["late\nx"]), 2), (200, server_answer(["T\nb"]), 0)]
    assert result(search(tool, {"query_list": ["q"]})[0]) == "Doc 1 (Title: T)\nb"  # the time-out was retried


def test_a_closed_port_is_reported_after_the_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tool = SearchTool({"retrieval_service_url": f"http://127.0.0.1:{port}/retrieve"}, None)
    message = result(search(tool, {"query_list": ["q"]})[0])
    assert message.startswith(f"Search error: request to http://127.0.0.1:{port}/retrieve failed (")
    assert message.endswith("(tried 10 times)")
