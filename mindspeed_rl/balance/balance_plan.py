"""One DP-balance plan per consumer per round.

A plan splits a pool of units (rows, or whole GRPO groups of n rows) into
shares of near-equal workload. Two ways to serve it:

- ``make_plan`` returns the whole split; the caller binds share ``s`` to a
  DP rank (our dock: rank r gets shares r, r + dp, ...), so which rank gets
  which rows never depends on timing.
- ``next_share`` serves shares first come, first served (upstream's API):
  the first request plans over the ready pool, later requests of the same
  shape pop the remaining shares. A plan is rebuilt when it is used up, when
  a request of another shape comes, when one of its shares is no longer
  usable, or after ``drop``.

``exact_shares`` plans over the largest multiple of the request size (the
rest joins the next plan), for callers that need exactly ``needed`` units per
share; otherwise the whole pool is split and sizes differ by at most one.
A plan that is not balanced is a random equal-size split, seeded per round;
its loads are recorded all the same, so balance on and off compare directly.
"""
from collections import deque
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from torch import Tensor

from mindspeed_rl.balance.seqlen_balancing import METHODS, balance_key, get_seqlen_balanced_partitions, imbalance
from mindspeed_rl.balance.workload import OBJECTIVES, WorkloadModel

# unit_lengths(units) -> int tensor (len(units), rows_per_unit) of token counts
UnitLengths = Callable[[Tensor], Tensor]


class BalancePlanner:
    def __init__(self, objective: str = "tokens", workload_model: Optional[WorkloadModel] = None,
                 method: str = "auto", seed: int = 1234, exact_shares: bool = False):
        if objective not in OBJECTIVES:
            raise ValueError(f"balance objective must be one of {OBJECTIVES}, got {objective!r}")
        if objective == "flops" and workload_model is None:
            raise ValueError("balance objective 'flops' needs a workload_model (model dimensions)")
        if method not in METHODS:
            raise ValueError(f"balance method must be one of {METHODS}, got {method!r}")
        self.objective, self.workload_model, self.method = objective, workload_model, method
        self.seed, self.exact_shares = seed, exact_shares
        self.history: List[dict] = []  # per plan: consumer, per-share loads (served and random), sizes
        self.reset(0)

    def reset(self, round_index: int = 0):
        """Forget every plan; random splits of this round are seeded by (seed, round)."""
        self._plans: Dict[str, tuple] = {}
        self._rng = np.random.default_rng([self.seed, round_index])

    def drop(self, consumer: str):
        """Forget the plan of ``consumer`` (its rows were taken another way)."""
        self._plans.pop(consumer, None)

    def pop_history(self) -> List[dict]:
        """Plans recorded since the last call (for reports), oldest first."""
        out, self.history = self.history, []
        return out

    def next_share(self, consumer: str, usable: Tensor, needed: int, unit_lengths: UnitLengths,
                   metrics=None, unit: int = 1) -> Optional[Tensor]:
        """Units for one request of ``needed`` units, first come first served;
        every share has exactly ``needed`` units while the pool holds that many
        (the rest joins the next plan), else the whole (final, short) pool."""
        key, plan = self._plans.get(consumer, (None, None))
        if plan and key == (unit, needed):
            share = plan.popleft()
            if bool(torch.isin(share, usable).all()):
                return share
        self.drop(consumer)
        shares = self.make_plan(consumer, usable, needed, unit_lengths, metrics,
                                exact=usable.numel() >= needed)
        if not shares:
            return None
        plan = deque(shares)
        self._plans[consumer] = ((unit, needed), plan)
        return plan.popleft()

    def random_split(self, units: int, n_shares: int) -> List[np.ndarray]:
        """Positions ``0 .. units-1`` split at random into ``n_shares`` shares whose sizes differ by at most
        one: the split of a plan that is not balanced (seeded by (seed, round))."""
        return np.array_split(self._rng.permutation(units), n_shares)

    def unit_costs(self, lengths: Tensor) -> np.ndarray:
        """Workload per unit from its rows' token counts (units x rows)."""
        lengths = lengths.to(torch.int64).numpy()
        if self.objective == "flops":
            return self.workload_model.cost(lengths).sum(axis=1)
        return lengths.sum(axis=1).astype(np.float64)

    def make_plan(self, consumer: str, usable: Tensor, needed: int, unit_lengths: UnitLengths,
                  metrics=None, balanced: bool = True, exact: Optional[bool] = None,
                  n_shares: Optional[int] = None) -> List[Tensor]:
        """Split ``usable`` units into shares of at most ``needed`` units
        (exactly ``needed`` with ``exact``; default: the planner's ``exact_shares``),
        or into exactly ``n_shares`` shares whose sizes differ by at most one."""
        exact = self.exact_shares if exact is None else exact
        total = usable.numel()
        if n_shares is not None:
            if not 0 < n_shares <= total:
                raise ValueError(f"make_plan('{consumer}'): {total} units cannot fill {n_shares} shares")
            exact = False
        elif needed <= 0 or total == 0 or (exact and total < needed):
            return []
        else:
            n_shares = total // needed if exact else -(-total // needed)
        pool = usable[: n_shares * needed] if exact else usable
        costs = self.unit_costs(unit_lengths(pool))
        if n_shares == 1:
            parts = [np.arange(pool.numel())]
        elif balanced:
            parts = [np.asarray(p, dtype=np.int64) for p in get_seqlen_balanced_partitions(
                costs, n_shares, equal_size=True, method=self.method)]
        else:
            parts = self.random_split(pool.numel(), n_shares)
        self._record(consumer, costs, parts, metrics, balanced)
        return [pool[torch.from_numpy(p.astype(np.int64))] for p in parts]

    def _record(self, consumer, costs, parts, metrics, balanced):
        """Loads of this plan, next to what a random split of the same pool gives."""
        sizes = np.array([len(p) for p in parts])
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        loads = np.add.reduceat(costs[np.concatenate(parts)], starts)
        random_loads = np.add.reduceat(costs[self._rng.permutation(costs.size)], starts)
        mean = costs.sum() / len(parts)
        self.history.append({"consumer": consumer, "objective": self.objective, "balanced": balanced,
                             "loads": loads.tolist(), "random_loads": random_loads.tolist(),
                             "sizes": sizes.tolist()})
        if metrics is None:
            return
        values = {"imbalance": imbalance(loads), "imbalance_random": imbalance(random_loads),
                  "max_load": loads.max(), "min_load": loads.min(), "mean_load": mean, "shares": len(parts)}
        metrics.update(value={balance_key(consumer, k): [float(v)] for k, v in values.items()}, cumulate=True)
