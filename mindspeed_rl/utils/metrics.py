# coding=utf-8
"""A small key -> value store for training metrics."""
from numbers import Number
from typing import Any, Dict, List

import numpy as np
import torch

from mindspeed_rl.balance.seqlen_balancing import balance_key, imbalance  # noqa: F401  (re-exported: one definition)


def _check_key(key) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"metric key must be a non-empty str, got {key!r}")


def _as_items(value) -> List[Any]:
    # values that extend a cumulated list
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, (torch.Tensor, np.ndarray)):  # a 0-d one gives one number
        return list(value.reshape(-1).tolist())
    return [value]


def _to_float(key: str, value) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            raise ValueError(f"metric '{key}' holds an empty tensor")
        return float(value.detach().float().mean())
    if isinstance(value, np.ndarray):
        if value.size == 0:
            raise ValueError(f"metric '{key}' holds an empty array")
        return float(value.astype(np.float64).mean())
    if isinstance(value, Number):
        return float(value)
    raise TypeError(f"metric '{key}' holds a non-numeric value of type {type(value).__name__}")


class Metric:
    """Holds metrics in `self.metric`; cumulated entries are lists."""

    def __init__(self):
        self.metric = {}

    def update(self, key="", value=None, cumulate=False):
        """Set `key` to `value`, or each item of a dict `value`; with `cumulate` extend a list."""
        if isinstance(value, dict):
            for k in value:
                _check_key(k)
            items = value.items()
        else:
            _check_key(key)
            items = [(key, value)]
        for k, v in items:
            if not cumulate:
                self.metric[k] = v
                continue
            old = self.metric.get(k)
            if k not in self.metric:
                self.metric[k] = _as_items(v)
            elif isinstance(old, list):
                old.extend(_as_items(v))
            else:
                # promote a plain value to a list before appending
                self.metric[k] = [old] + _as_items(v)

    def compute(self) -> Dict[str, float]:
        """Flatten to floats: lists are averaged, tensors reduced via float(); None/empty skipped."""
        result = {}
        for key, value in self.metric.items():
            if value is None:
                continue
            if isinstance(value, (list, tuple)):
                if not value:
                    continue
                result[key] = sum(_to_float(key, v) for v in value) / len(value)
            else:
                result[key] = _to_float(key, value)
        return result

    def reset(self):
        self.metric = {}


# ---------------------------------------------------------------- DP balance: one definition


def rank_balance_metrics(results: List[Dict[str, float]]) -> Dict[str, float]:
    """What each DP rank actually processed per stage (``load/<stage>`` of its TP source, tp_rank 0):
    ``rank<k>`` and ``rank_imbalance`` = max / mean - 1."""
    out = {}
    for key in sorted({k for r in results for k in r if k.startswith("load/")}):
        stage = key[len("load/"):]
        loads = {int(r["dp_rank"]): r[key] for r in results if key in r and r["tp_rank"] == 0}
        for dp_rank, load in sorted(loads.items()):
            out[balance_key(stage, f"rank{dp_rank}")] = load
        out[balance_key(stage, "rank_imbalance")] = imbalance(list(loads.values()))
    return out


def per_rank(values, ranks) -> List[float]:
    """Per-share values summed per DP rank (``ranks[s]`` = the rank share ``s`` goes to)."""
    if len(values) != len(ranks):
        raise ValueError(f"per_rank: {len(values)} values for {len(ranks)} ranks")
    out = [0.0] * (max(ranks) + 1)
    for rank, value in zip(ranks, values):
        out[rank] += value
    return out


def plan_loads(plan: dict, key: str) -> List[float]:
    """A balance plan's ``loads``, ``random_loads`` or ``sizes`` per DP rank when its shares are bound to ranks
    (``ranks``), else per share: what the balance report draws."""
    values = [float(v) for v in plan[key]]
    return per_rank(values, plan["ranks"]) if plan.get("ranks") else values


def plan_balance_metrics(plans: List[dict]) -> Dict[str, float]:
    """``dp_balance/<consumer>/rank_imbalance_random``: the imbalance over DP ranks of the random split
    each plan records (the console's 'random' next to ``rank_imbalance``); mean over a consumer's plans.
    ``rows_per_rank_max``: the most rows one DP rank got in any of them, where every plan records its shares'
    ``sizes`` (1: any split is the same split, nothing to balance)."""
    per_consumer: Dict[str, List[float]] = {}
    most: Dict[str, List[float]] = {}
    for plan in plans:
        per_consumer.setdefault(plan["consumer"], []).append(imbalance(plan_loads(plan, "random_loads")))
        most.setdefault(plan["consumer"], []).append(max(plan_loads(plan, "sizes"), default=0.0)
                                                      if "sizes" in plan else None)
    out = {balance_key(c, "rank_imbalance_random"): sum(v) / len(v) for c, v in per_consumer.items()}
    out.update({balance_key(c, "rows_per_rank_max"): max(v) for c, v in most.items() if None not in v})
    return out
