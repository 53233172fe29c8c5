"""One DP-balance plan per consumer per round, served share by share.

The first request that finds the consumer without a plan partitions the whole
ready pool (rows, or GRPO groups of n rows) into ``ceil(pool / count)``
shares of near-equal workload, at most ``count`` units each and sizes within
one unit of each other. Later requests of the same shape pop the remaining
shares; a plan is rebuilt when it is used up, when a request of another shape
comes, or when its rows were taken another way.
"""
from collections import deque
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from mindspeed_rl.utils.seqlen_balancing import METHODS, get_seqlen_balanced_partitions
from mindspeed_rl.utils.workload import OBJECTIVES, WorkloadModel


class BalancePlanner:
    def __init__(self, objective: str = "tokens", workload_model: Optional[WorkloadModel] = None,
                 method: str = "auto", seed: int = 1234):
        if objective not in OBJECTIVES:
            raise ValueError(f"balance objective must be one of {OBJECTIVES}, got {objective!r}")
        if objective == "flops" and workload_model is None:
            raise ValueError("balance objective 'flops' needs a workload_model (model dimensions)")
        if method not in METHODS:
            raise ValueError(f"balance method must be one of {METHODS}, got {method!r}")
        self.objective, self.workload_model, self.method = objective, workload_model, method
        self._rng = np.random.default_rng(seed)  # random-split baseline, seeded once
        self.history = []  # per plan: consumer, per-share loads (ours and random), sizes
        self.reset()

    def reset(self):
        """Forget every plan (a new round)."""
        self._plans: Dict[str, Tuple[Tuple[int, int], deque]] = {}

    def pop_history(self):
        """Plans recorded since the last call (for reports), oldest first."""
        out, self.history = self.history, []
        return out

    def drop(self, consumer: str):
        self._plans.pop(consumer, None)

    def next_share(self, consumer: str, usable: Tensor, needed: int, row_lengths: Callable[[], Tensor],
                   unit: int, metrics) -> Tensor:
        """Units (rows, or groups when ``unit`` > 1) for this request. A
        stored plan serves only requests of the same shape (unit, count); the
        dock drops a plan whose rows were taken another way."""
        key, plan = self._plans.get(consumer, (None, None))
        if plan and key == (unit, needed):
            return plan.popleft()
        plan = deque(self._make_plan(consumer, usable, needed, row_lengths(), unit, metrics))
        self._plans[consumer] = ((unit, needed), plan)
        return plan.popleft()

    def unit_costs(self, row_lengths: Tensor, unit: int, usable: Tensor) -> np.ndarray:
        lengths = row_lengths.view(-1, unit)[usable].numpy()
        if self.objective == "flops":
            return self.workload_model.cost(lengths).sum(axis=1)
        return lengths.sum(axis=1).astype(np.float64)

    def _make_plan(self, consumer, usable, needed, row_lengths, unit, metrics):
        costs = self.unit_costs(row_lengths, unit, usable)
        n_shares = -(-usable.numel() // needed)
        if n_shares == 1:
            parts = [list(range(usable.numel()))]
        else:
            parts = get_seqlen_balanced_partitions(costs, n_shares, equal_size=True, method=self.method)
        self._record(consumer, costs, parts, metrics)
        order = torch.from_numpy(np.concatenate(parts).astype(np.int64))
        return list(torch.split(usable[order], [len(p) for p in parts]))

    def _record(self, consumer, costs, parts, metrics):
        """Loads of this plan, and what a random split of the same pool gives."""
        sizes = np.array([len(p) for p in parts])
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        loads = np.add.reduceat(costs[np.concatenate(parts).astype(np.int64)], starts)
        random_loads = np.add.reduceat(costs[self._rng.permutation(costs.size)], starts)
        mean = costs.sum() / len(parts)
        self.history.append({"consumer": consumer, "objective": self.objective, "loads": loads.tolist(),
                             "random_loads": random_loads.tolist(), "sizes": sizes.tolist()})
        prefix = f"dp_balance/{consumer}"
        metrics.update(value={
            f"{prefix}/imbalance": loads.max() / mean - 1 if mean > 0 else 0.0,
            f"{prefix}/imbalance_random": random_loads.max() / mean - 1 if mean > 0 else 0.0,
            f"{prefix}/max_load": float(loads.max()),
            f"{prefix}/min_load": float(loads.min()),
            f"{prefix}/mean_load": float(mean),
            f"{prefix}/shares": float(len(parts)),
        }, cumulate=True)
