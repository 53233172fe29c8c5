"""Metrics of an iteration that ran its rollout stages several times (DAPO's refills, partial rollout's passes)."""
from typing import Dict, List

# per-rank keys that add up over the rollout batches of one iteration (multi-turn counts: each pass's work once)
_ADDITIVE = ("timing/", "tokens/", "load/", "multi_turn/count/")


def merge_rollout_metrics(parts: List[Dict[str, float]]) -> Dict[str, float]:
    """Metrics of several rollout batches as one: max of */max, min of */min, else the mean."""
    out = {}
    for key in {k for p in parts for k in p}:
        values = [p[key] for p in parts if key in p]
        out[key] = max(values) if key.endswith("/max") else min(values) if key.endswith("/min") \
            else sum(values) / len(values)
    return out


def sum_by_rank(results: List[Dict[str, float]]) -> List[Dict[str, float]]:
    """One metrics dict per rank: stage times, tokens and loads summed over the batches."""
    by_rank: Dict[float, Dict[str, float]] = {}
    for r in results:
        mine = by_rank.setdefault(r["rank"], {})
        for key, value in r.items():
            mine[key] = mine.get(key, 0.0) + value if key.startswith(_ADDITIVE) else value
    return list(by_rank.values())
