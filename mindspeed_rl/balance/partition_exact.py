"""Exact branch and bound for small equal-size partitioning.

Used by the balancer on tiny inputs (a few GRPO groups per rank on few ranks),
where local search can stop a little above the optimum. The search is bounded
by a node budget; it returns an improvement over ``upper`` or None.
"""
import itertools
from typing import Optional

import numpy as np


def exact_equal_partition(weights, k: int, upper: float, node_limit: int = 20_000) -> Optional[np.ndarray]:
    """Assignment with heaviest load below ``upper`` and ``n / k`` items per
    partition, optimal if the node budget suffices; None if none was found."""
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    if n % k:
        return None
    size = n // k
    values = w.tolist()
    order = sorted(range(n), key=lambda i: -values[i])
    best = {"load": upper, "groups": None}
    nodes = [0]

    def search(rest, total, cur, groups):
        nodes[0] += 1
        if nodes[0] > node_limit:
            return
        left = len(rest) // size
        if max(cur, total / left if left else 0.0) >= best["load"]:
            return
        if not rest:
            best["load"], best["groups"] = cur, list(groups)
            return
        head, tail = rest[0], rest[1:]  # the largest item opens the next group
        for comb in itertools.combinations(tail, size - 1):
            nodes[0] += 1  # every candidate group counts against the budget
            if nodes[0] > node_limit:
                return
            load = values[head] + sum(values[j] for j in comb)
            if load >= best["load"]:
                continue
            taken = set(comb)
            groups.append((head,) + comb)
            search([j for j in tail if j not in taken], total - load, max(cur, load), groups)
            groups.pop()
            if nodes[0] > node_limit:
                return

    search(order, float(w.sum()), 0.0, [])
    if best["groups"] is None:
        return None
    assign = np.empty(n, dtype=np.int64)
    for p, group in enumerate(best["groups"]):
        assign[list(group)] = p
    return assign
