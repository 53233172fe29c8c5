"""Local search that lowers the heaviest partition of an assignment.

Works on an item -> partition assignment vector, in two phases:
1. ``pairwise_rounds``: the i-th heaviest partition is paired with the i-th
   lightest and all pairs make their best one-for-one exchange at once.
2. ``_Search``: the heaviest partition alone looks, among the lightest
   partitions first and then all, for the exchange (one for one, a single
   move, or two for two) that makes ``max(load_h', load_p')`` smallest while
   both stay strictly below the old ``load_h``.
The sorted load vector shrinks lexicographically at every accepted step, so
the search ends; a deterministic work budget bounds its cost.
"""
from dataclasses import dataclass

import numpy as np

# Candidate pairs scored by one exchange search.
_PAIR_BUDGET = 1 << 16
# Items of the heaviest partition scored per search (spread by weight).
_MAX_SIDE = 256
# Two-for-two exchanges are tried only for partitions this small.
_MAX_PAIR_SWAP_COUNT = 16
# Partitions searched first in each step (the lightest ones).
_NEAR_PARTS = 16
# Work units (about one scored pair each) charged per exchange search and per step.
_CALL_COST = 15_000
_STEP_COST = 25_000
# Default work budget: a few tens of milliseconds of searching.
DEFAULT_WORK = 8_000_000


def group_order(assign, k):
    """Item ids grouped by partition (stable); small ints sort by radix."""
    small = assign.astype(np.int16 if k < (1 << 15) else np.int32)
    return np.argsort(small, kind="stable")


def load_lower_bound(weights, k, min_count=1, depth=8):
    """No split into ``k`` partitions of at least ``min_count`` items each can
    make the heaviest load smaller than this. Terms: the mean load; and, for
    m = 1..depth, pigeonhole: of the (m-1)k+1 largest items some partition holds
    m, so its load is at least the m smallest of them plus the
    ``min_count - m`` smallest items overall."""
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    bound = w.sum() / k
    top_n = min(n, (depth - 1) * k + 1)
    top = -np.sort(-np.partition(w, n - top_n)[n - top_n:])  # largest first
    c = max(1, int(min_count))
    small = np.concatenate(([0.0], np.cumsum(np.sort(np.partition(w, min(c, n - 1))[:c]))))
    for m in range(1, depth + 1):
        end = (m - 1) * k + 1
        if end > top_n:
            break
        bound = max(bound, top[end - m:end].sum() + small[max(0, c - m)])
    return float(bound)


def _best_exchange(lh, h_sums, cand_sums, cand_loads):
    """Best (i, j, new_max) exchanging bundle i of h with bundle j elsewhere."""
    d = h_sums[:, None] - cand_sums[None, :]
    new_max = np.maximum(lh - d, cand_loads[None, :] + d)
    new_max = np.where((d > 0) & (new_max < lh), new_max, np.inf)
    flat = int(np.argmin(new_max))
    i, j = divmod(flat, new_max.shape[1])
    if not np.isfinite(new_max[i, j]):
        return None
    return i, j, float(new_max[i, j])


def _thin(items, w, cap):
    """At most ``cap`` of ``items``, spread evenly over their sorted weights."""
    if items.size <= cap:
        return items
    ranked = items[np.argsort(w[items], kind="stable")]
    return ranked[np.linspace(0, items.size - 1, cap).round().astype(np.int64)]


def _pairs(items, w):
    """All 2-item bundles of ``items`` with their summed weights."""
    a, b = np.triu_indices(items.size, k=1)
    return np.stack([items[a], items[b]], axis=1), w[items[a]] + w[items[b]]


@dataclass
class _Move:
    new_max: float
    give: np.ndarray  # items leaving h
    take: np.ndarray  # items coming to h
    part: int


class _Search:
    """State of phase 2: loads, counts and members grouped by partition."""

    def __init__(self, w, assign, k, min_count, max_count, work):
        self.w, self.assign, self.k = w, assign, k
        self.min_count, self.max_count = min_count, max_count
        self.budget = work
        self.loads = np.bincount(assign, weights=w, minlength=k)
        self.counts = np.bincount(assign, minlength=k)
        self._index()

    def _index(self):
        self.order = group_order(self.assign, self.k)
        self.pos = np.empty_like(self.order)
        self.pos[self.order] = np.arange(self.order.size)
        self.offsets = np.concatenate(([0], np.cumsum(self.counts)))

    def members(self, part):
        return self.order[self.offsets[part]:self.offsets[part + 1]]

    def _exchange(self, lh, h_sums, cand_sums, cand_loads):
        self.budget -= h_sums.size * cand_sums.size + _CALL_COST
        return _best_exchange(lh, h_sums, cand_sums, cand_loads)

    def _parts(self, h, limit):
        """The lightest partitions other than h, lightest first."""
        m = int(min(self.k - 1, limit))
        order = np.argpartition(self.loads, m)[: m + 1] if m + 1 < self.k else np.arange(self.k)
        order = order[order != h][:m]
        return order[np.argsort(self.loads[order], kind="stable")]

    def step(self, h):
        """Best move for the heaviest partition ``h``, or None."""
        self.budget -= _STEP_COST
        move = self._search(h, _NEAR_PARTS)
        if move is None and self.k - 1 > _NEAR_PARTS:
            move = self._search(h, self.k)
        return move

    def _search(self, h, limit):
        w, lh = self.w, self.loads[h]
        parts = self._parts(h, limit)
        h_items = self.members(h)
        side = _thin(h_items, w, _MAX_SIDE)
        pool = np.concatenate([self.members(p) for p in parts])
        cand = _thin(pool, w, _PAIR_BUDGET // max(1, side.size))
        best = None
        if cand.size and side.size:
            r = self._exchange(lh, w[side], w[cand], self.loads[self.assign[cand]])
            if r is not None:
                best = _Move(r[2], side[r[0]:r[0] + 1], cand[r[1]:r[1] + 1], int(self.assign[cand[r[1]]]))
        if self.counts[h] - 1 >= self.min_count and side.size:
            open_parts = parts[self.counts[parts] + 1 <= self.max_count]
            if open_parts.size:
                r = self._exchange(lh, w[side], np.zeros(open_parts.size), self.loads[open_parts])
                if r is not None and (best is None or r[2] < best.new_max):
                    best = _Move(r[2], side[r[0]:r[0] + 1], side[:0], int(open_parts[r[1]]))
        if best is None and 2 <= h_items.size <= _MAX_PAIR_SWAP_COUNT:
            best = self._search_pairs(h, h_items, parts)
        return best

    def _search_pairs(self, h, h_items, parts):
        """Two-for-two exchanges with small partitions, lightest first."""
        w, counts = self.w, self.counts
        h_pairs, h_sums = _pairs(h_items, w)
        small = parts[(counts[parts] >= 2) & (counts[parts] <= _MAX_PAIR_SWAP_COUNT)]
        n_pairs = counts[small] * (counts[small] - 1) // 2
        small = small[np.cumsum(n_pairs) * h_sums.size <= _PAIR_BUDGET]
        best = None
        for c in np.unique(counts[small]):
            group = small[counts[small] == c]
            mat = np.stack([self.members(p) for p in group])
            a, b = np.triu_indices(int(c), k=1)
            p_pairs = np.stack([mat[:, a], mat[:, b]], axis=2).reshape(-1, 2)
            owner = np.repeat(group, a.size)
            r = self._exchange(self.loads[h], h_sums, w[p_pairs].sum(axis=1), self.loads[owner])
            if r is not None and (best is None or r[2] < best.new_max):
                best = _Move(r[2], h_pairs[r[0]], p_pairs[r[1]], int(owner[r[1]]))
        return best

    def apply(self, h, move):
        p = move.part
        delta = self.w[move.give].sum() - self.w[move.take].sum()
        self.loads[h] -= delta
        self.loads[p] += delta
        self.assign[move.give] = p
        self.assign[move.take] = h
        if move.give.size == move.take.size:
            for a, b in zip(move.give, move.take):
                pa, pb = self.pos[a], self.pos[b]
                self.order[pa], self.order[pb] = b, a
                self.pos[a], self.pos[b] = pb, pa
        else:
            shift = move.give.size - move.take.size
            self.counts[h] -= shift
            self.counts[p] += shift
            self._index()


def _dense_slots(assign, k):
    """(k, c) matrix of item ids per partition, -1 where a partition is short."""
    counts = np.bincount(assign, minlength=k)
    order = group_order(assign, k)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    col = np.arange(order.size) - np.repeat(starts, counts)
    slots = np.full((k, int(counts.max())), -1, dtype=np.int64)
    slots[assign[order], col] = order
    return slots


def pairwise_rounds(weights, assign, k, max_rounds=16, stop_at=-np.inf):
    """Phase 1: batched one-for-one exchanges between the i-th heaviest and the
    i-th lightest partition, all pairs at once (a sorted search per pair).
    Counts never change. Stops when no pair improves. Updates ``assign``."""
    w = np.asarray(weights, dtype=np.float64)
    if k < 2 or w.size <= k:
        return assign
    slots = _dense_slots(assign, k)
    vals = np.where(slots >= 0, w[np.maximum(slots, 0)], -np.inf)  # pads never move
    loads = np.where(slots >= 0, vals, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore"):
        for _ in range(max_rounds):
            if loads.max() <= stop_at or not _exchange_round(w, assign, slots, vals, loads):
                break
    return assign


def _exchange_round(w, assign, slots, vals, loads):
    k, c = slots.shape
    half = k // 2
    rows = np.arange(half)
    rank = np.argsort(-loads, kind="stable")
    heavy, light = rank[:half], rank[::-1][:half]
    lh, ll = loads[heavy][:, None], loads[light][:, None]
    # for each heavy item x, the light items nearest x - gap / 2
    light_order = np.argsort(vals[light], axis=1, kind="stable")
    light_sorted = np.take_along_axis(vals[light], light_order, axis=1)
    span = 4.0 * (np.abs(w).max() + 1.0)
    offs = rows[:, None] * span
    flat = (np.where(np.isfinite(light_sorted), light_sorted, -span / 2) + offs).ravel()
    target = vals[heavy] - (lh - ll) / 2 + offs
    pos = np.searchsorted(flat, target.ravel()).reshape(half, c) - rows[:, None] * c
    best_val = np.full(half, np.inf)
    best_x = np.zeros(half, dtype=np.int64)
    best_y = np.zeros(half, dtype=np.int64)
    for shift in (-1, 0):
        yi = np.clip(pos + shift, 0, c - 1)
        y = np.take_along_axis(light_sorted, yi, axis=1)
        d = vals[heavy] - y
        new_max = np.maximum(lh - d, ll + d)
        ok = (d > 0) & (new_max < lh) & np.isfinite(y) & np.isfinite(vals[heavy])
        new_max = np.where(ok, new_max, np.inf)
        xi = np.argmin(new_max, axis=1)
        v = new_max[rows, xi]
        better = v < best_val
        best_val = np.where(better, v, best_val)
        best_x = np.where(better, xi, best_x)
        best_y = np.where(better, np.take_along_axis(light_order, yi, axis=1)[rows, xi], best_y)
    done = np.flatnonzero(np.isfinite(best_val))
    if done.size == 0:
        return False
    hr, lr, xs, ys = heavy[done], light[done], best_x[done], best_y[done]
    hx, ly = slots[hr, xs].copy(), slots[lr, ys].copy()
    d = w[hx] - w[ly]
    slots[hr, xs], slots[lr, ys] = ly, hx
    vals[hr, xs], vals[lr, ys] = w[ly], w[hx]
    loads[hr] -= d
    loads[lr] += d
    assign[hx], assign[ly] = lr, hr
    return True


def refine_assignment(weights, assign, k, min_count=1, max_count=None, work=DEFAULT_WORK, tol=1e-4):
    """Improve ``assign`` in place so that the heaviest partition gets lighter.

    ``min_count``/``max_count`` bound the items per partition: exchanges keep
    counts, single moves happen only inside the bounds. ``work`` caps the
    effort in units of about one scored candidate pair, so the cost stays
    bounded whatever the input. The search stops early once the heaviest load
    is within ``tol`` (relative) of a lower bound. Returns ``assign``.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    if n == 0 or k <= 1:
        return assign
    max_count = n if max_count is None else max_count
    stop_at = load_lower_bound(w, k, min_count) * (1.0 + tol)
    rounds = int(min(16, max(1, work // (256 * n))))
    pairwise_rounds(w, assign, k, max_rounds=rounds, stop_at=stop_at)
    search = _Search(w, assign, k, min_count, max_count, work - rounds * 64 * n)
    while search.budget > 0:
        h = int(np.argmax(search.loads))
        if search.loads[h] <= stop_at:
            break
        move = search.step(h)
        if move is None:
            break
        search.apply(h, move)
    return assign
