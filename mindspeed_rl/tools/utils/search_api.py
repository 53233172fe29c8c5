"""A retrieval server's search (upstream's request and answer) and the text the model reads.

Request: POST ``{"queries": [...], "topk": k, "return_scores": true}``; answer: ``{"result": [per query: [{"document":
{"contents": "<title>\\n<text>"}, "score": s}, ...]]}``. Retried on 500/502/503/504, a refused connection and a
time-out, with back-off 1 s, 2 s, ..."""
import asyncio
import json
from typing import List, Optional, Tuple

import aiohttp

RETRY_STATUSES = (500, 502, 503, 504)
RETRY_DELAY_S = 1.0
NO_RESULTS = "No search results found."


async def call_search_api(retrieval_service_url: str, query_list: List[str], topk: int = 3,
                          return_scores: bool = True, timeout: float = 30,
                          max_retries: int = 10) -> Tuple[Optional[dict], Optional[str]]:
    """``(answer JSON, None)`` or ``(None, one-line error)``."""
    payload = {"queries": query_list, "topk": topk, "return_scores": return_scores}
    error = "no request was made (max_retries < 1)"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        for attempt in range(1, max_retries + 1):
            try:
                async with session.post(retrieval_service_url, json=payload) as resp:
                    if resp.status == 200:
                        try:
                            return await resp.json(content_type=None), None
                        except ValueError:
                            return None, f"the answer of {retrieval_service_url} is not JSON"
                    error = f"HTTP {resp.status} from {retrieval_service_url}"
                    if resp.status not in RETRY_STATUSES:
                        return None, error
            except asyncio.TimeoutError:
                error = f"no answer from {retrieval_service_url} in {timeout:g} s"
            except aiohttp.ClientConnectionError as e:
                error = f"request to {retrieval_service_url} failed ({type(e).__name__})"
            if attempt < max_retries:
                await asyncio.sleep(RETRY_DELAY_S * attempt)
    return None, f"{error} (tried {max_retries} times)"


def passages2string(retrieval_result: List[dict]) -> str:
    """``Doc i (Title: <first line>)`` and the rest of each document, a blank line between documents."""
    parts = []
    for i, item in enumerate(retrieval_result, start=1):
        title, _, text = item["document"]["contents"].partition("\n")
        parts.append(f"Doc {i} (Title: {title})\n{text}")
    return "\n\n".join(parts)


def results_text(per_query: List[List[dict]]) -> str:
    """The tool's answer: JSON ``{"result": ...}``, one block per query, ``---`` lines between them."""
    blocks = [passages2string(hits) if hits else NO_RESULTS for hits in per_query]
    return json.dumps({"result": "\n---\n".join(blocks) if blocks else NO_RESULTS}, ensure_ascii=False)


def error_text(message: str) -> str:
    return json.dumps({"result": message}, ensure_ascii=False)
