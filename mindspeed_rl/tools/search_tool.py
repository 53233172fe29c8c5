"""``SearchTool`` (``search``): answers a list of queries with documents.

Config keys (upstream's, plus ``corpus_path``); exactly one of the two sources is set:

    retrieval_service_url     None  a retrieval server (upstream's request/answer, utils/search_api.py)
    corpus_path               None  a local JSONL corpus searched with BM25 (utils/search_corpus.py); read once,
                                    when the tool starts
    topk                      3     documents per query
    timeout                   30    seconds for one server request
    num_workers               120   searches of this tool at once (in this process)
    rate_limit                120   calls of all tools with enable_global_rate_limit at once (in this process)
    enable_global_rate_limit  True

The answer is JSON ``{"result": ...}`` as upstream's; metrics: query_count, status (ok / error),
total_results, api_request_error, wall_seconds."""
import asyncio
import time
from typing import Any, Dict, Tuple

from mindspeed_rl.tools.base_tool import BaseTool
from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema, function_tool_schema
from mindspeed_rl.tools.utils.concurrency import ConcurrencyLimit, global_limit, limited
from mindspeed_rl.tools.utils.search_api import call_search_api, error_text, results_text
from mindspeed_rl.tools.utils.search_corpus import LocalCorpus
from mindspeed_rl.tools.utils.tool_config import settle_config

DEFAULTS = {"retrieval_service_url": None, "corpus_path": None, "topk": 3, "timeout": 30.0, "num_workers": 120,
            "rate_limit": 120, "enable_global_rate_limit": True}


def _well_formed(answer) -> bool:
    return isinstance(answer, dict) and isinstance(answer.get("result"), list) and all(
        isinstance(hits, list) and all(isinstance(h, dict) and isinstance((h.get("document") or {}).get(
            "contents"), str) for h in hits) for hits in answer["result"])


class SearchTool(BaseTool):
    parameters = frozenset({"query_list"})

    def __init__(self, config: dict, tool_schema=None):
        super().__init__(config, tool_schema)
        self.settings = settle_config(self.config, DEFAULTS)
        self.retrieval_service_url = self.settings["retrieval_service_url"] or None
        corpus_path = self.settings["corpus_path"] or None
        if (self.retrieval_service_url is None) == (corpus_path is None):
            raise ValueError("set exactly one of retrieval_service_url (a retrieval server) and corpus_path "
                             "(a local JSONL corpus)")
        self.corpus = LocalCorpus(corpus_path) if corpus_path else None
        self._own = ConcurrencyLimit(self.settings["num_workers"])
        self._shared = global_limit(self.settings["rate_limit"]) \
            if self.settings["enable_global_rate_limit"] else None

    @classmethod
    def default_tool_schema(cls) -> OpenAIFunctionToolSchema:
        return function_tool_schema("search", "Searches documents for each query and returns the best matches.",
                                    query_list=("array", "The queries, one string each."))

    async def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs) -> Tuple[str, float, dict]:
        query_list = parameters.get("query_list")
        if not isinstance(query_list, list) or not query_list or \
                not all(isinstance(q, str) for q in query_list):
            return error_text("Error: 'query_list' is missing, empty, or not a list of strings."), 0.0, {}
        start = time.monotonic()
        async with limited(self._own, self._shared):
            if self.corpus is not None:
                answer, error = {"result": await asyncio.to_thread(
                    self.corpus.search, query_list, self.settings["topk"])}, None
            else:
                answer, error = await call_search_api(self.retrieval_service_url, query_list,
                                                      self.settings["topk"], True, self.settings["timeout"])
        if error is None and not _well_formed(answer):
            error = "the answer has no 'result' list of documents per query"
        metrics = {"query_count": len(query_list), "status": "ok" if error is None else "error",
                   "total_results": 0 if error else sum(len(h) for h in answer["result"]),
                   "api_request_error": error, "wall_seconds": time.monotonic() - start}
        if error is not None:
            return error_text(f"Search error: {error}"), 0.0, metrics
        return results_text(answer["result"]), 0.0, metrics
