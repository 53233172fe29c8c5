"""SearchTool's parts: which server answers are documents, the schema the model sees (built in or given), the
shared rate limit it holds while searching, and the metrics and reward of an error."""
import asyncio

import pytest

from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema
from mindspeed_rl.tools.search_tool import SearchTool, _well_formed
from mindspeed_rl.tools.utils import concurrency
from tests.ut.tools.test_search_tool import corpus, no_back_off, result, search  # noqa: F401  (fixtures)


@pytest.mark.parametrize("answer, ok", [
    ({"result": [[{"document": {"contents": "T\nb"}}], []]}, True),
    ({"result": []}, True),
    ([], False),
    ({"result": "none"}, False),
    ({"result": ["not a list of hits"]}, False),
    ({"result": [["not a hit"]]}, False),
    ({"result": [[{"document": {"contents": 3}}]]}, False),
    ({"result": [[{"contents": "no document"}]]}, False),
])
def test_which_answers_are_documents(answer, ok):
    assert _well_formed(answer) is ok


def test_the_built_in_schema_and_a_given_one(corpus):
    built_in = SearchTool({"corpus_path": corpus}, None).tool_schema.model_dump(exclude_none=True)
    assert built_in == {"type": "function", "function": {
        "name": "search", "strict": False,
        "description": "Searches documents for each query and returns the best matches.",
        "parameters": {"type": "object", "required": ["query_list"], "properties": {
            "query_list": {"type": "array", "description": "The queries, one string each."}}}}}
    given = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": "lookup", "description": "d", "parameters": {"type": "object", "properties": {
            "query_list": {"type": "array"}}, "required": ["query_list"]}}})
    tool = SearchTool({"corpus_path": corpus}, given)
    assert tool.tool_schema is given and tool.name == "lookup"


def test_a_search_holds_the_shared_limit_unless_it_is_off(corpus, monkeypatch):
    monkeypatch.setattr(concurrency, "_GLOBAL", {})
    shared = SearchTool({"corpus_path": corpus, "rate_limit": 1}, None)
    alone = SearchTool({"corpus_path": corpus, "enable_global_rate_limit": False}, None)
    assert shared._shared is concurrency._GLOBAL["limit"] and alone._shared is None

    async def while_held():
        async with concurrency._GLOBAL["limit"]:  # every slot of the shared limit is taken
            free = await asyncio.wait_for(alone.aexecute("i", {"query_list": ["Paris"]}), 120)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(shared.aexecute("i", {"query_list": ["Paris"]}), 0.5)
        return free
    text, _, metrics = asyncio.run(while_held())
    assert metrics["status"] == "ok" and "Paris" in result(text)


def test_an_error_scores_zero_and_counts_no_results(http_stub):
    http_stub.replies.append((200, {"result": "none"}, 0))
    tool = SearchTool({"retrieval_service_url": http_stub.url + "/retrieve"}, None)
    text, reward, metrics = search(tool, {"query_list": ["q", "r"]})
    assert reward == 0.0
    assert set(metrics) == {"query_count", "status", "total_results", "api_request_error", "wall_seconds"}
    assert (metrics["query_count"], metrics["status"], metrics["total_results"]) == (2, "error", 0)
    assert 0.0 <= metrics["wall_seconds"] < 300.0


def test_a_search_reports_its_results_and_seconds(corpus):
    text, reward, metrics = search(SearchTool({"corpus_path": corpus, "topk": 2}, None), {"query_list": ["capital"]})
    assert reward == 0.0 and metrics["total_results"] == 2 and 0.0 <= metrics["wall_seconds"] < 300.0
