"""Sequence-length balancing: split item workloads into partitions of equal load.

Pure functions: lengths (or any non-negative workloads) go in as a list, numpy
array or torch tensor; lists of item indices come out. Nothing here talks to
torch.distributed; syncing counts across ranks lives in ``dist_sync``.

Size modes used throughout:
- ``equal_size=True``: every partition gets ``n // k`` or ``n // k + 1`` items
  (exactly equal when ``k`` divides ``n``);
- ``equal_size=False``: any non-zero item count per partition.
"""
import heapq
from typing import Dict, List, Optional, Sequence

import numpy as np

from mindspeed_rl.balance.partition_exact import exact_equal_partition
from mindspeed_rl.balance.partition_refine import DEFAULT_WORK, group_order, load_lower_bound, refine_assignment

METHODS = ("auto", "heapq", "karmarkar_karp", "greedy")
# Karmarkar-Karp costs about n (equal sizes) or n * k (free sizes) element
# steps; above this (n = 16384 with equal sizes) the default skips that start.
_KK_START_LIMIT = 1 << 17
# The plain heap LPT start (a Python loop) is added up to this many items.
_HEAP_START_ITEMS = 16384
# Inputs up to this size get the full refinement budget, larger ones less
# (their greedy start is already close to the bound).
_FULL_WORK_ITEMS = 8192
# Relative distance to the lower bound at which a split counts as optimal.
_TOL = 1e-4
# Up to this many items (equal sizes) a bounded exact search follows.
_EXACT_ITEMS = 24
# Up to this many items every start is refined, above it only the best one.
_REFINE_ALL_LIMIT = 512


def as_weights(values, name: str = "seqlen_list") -> np.ndarray:
    """Return ``values`` as a 1-D float64 array of finite, non-negative numbers."""
    if hasattr(values, "detach"):  # torch tensor
        values = values.detach().cpu().numpy()
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has a non-finite value at index {int(np.flatnonzero(~np.isfinite(arr))[0])}")
    if arr.size and arr.min() < 0:
        bad = int(np.argmin(arr))
        raise ValueError(f"{name} has a negative value {arr[bad]} at index {bad}")
    return arr


def _check_k(n: int, k_partitions: int):
    if not isinstance(k_partitions, (int, np.integer)) or isinstance(k_partitions, bool):
        raise TypeError(f"k_partitions must be an int, got {type(k_partitions).__name__}")
    if k_partitions <= 0:
        raise ValueError(f"k_partitions must be positive, got {k_partitions}")
    if k_partitions > n:
        raise ValueError(f"number of items:[{n}] < k_partitions:[{k_partitions}]")


def _count_bounds(n: int, k: int, equal_size: bool):
    if equal_size:
        return n // k, -(-n // k)
    return 1, n - k + 1


def _to_lists(assign: np.ndarray, k: int) -> List[List[int]]:
    order = group_order(assign, k)
    bounds = np.cumsum(np.bincount(assign, minlength=k))[:-1]
    return [part.tolist() for part in np.split(order, bounds)]


def _to_assign(partitions: Sequence[Sequence[int]], n: int) -> np.ndarray:
    assign = np.full(n, -1, dtype=np.int64)
    for p, items in enumerate(partitions):
        assign[np.asarray(items, dtype=np.int64)] = p
    return assign


# ---------------------------------------------------------------- starts


def heapq_partition(seqlen_list, k_partitions: int, equal_size: bool) -> List[List[int]]:
    """Longest-processing-time greedy with a heap: each item, largest first, goes
    to the lightest partition that still has room. With ``equal_size`` the item
    count must divide evenly (as in the original heap partition)."""
    w = as_weights(seqlen_list)
    n = w.size
    _check_k(n, k_partitions)
    if equal_size and n % k_partitions:
        raise ValueError(f"equal_size needs len(seqlen_list)={n} divisible by k_partitions={k_partitions}")
    cap = n // k_partitions if equal_size else n
    order = np.argsort(-w, kind="stable").tolist()
    heap = [(0.0, 0, p) for p in range(k_partitions)]
    partitions: List[List[int]] = [[] for _ in range(k_partitions)]
    values = w.tolist()
    for i in order:
        load, cnt, p = heapq.heappop(heap)
        partitions[p].append(i)
        if cnt + 1 < cap:
            heapq.heappush(heap, (load + values[i], cnt + 1, p))
    return partitions


def greedy_rounds(seqlen_list, k_partitions: int) -> List[List[int]]:
    """Vectorised count-balanced greedy (batched LPT): items, largest first, are
    handed out in batches of ``3k / 4``; each batch goes to the lightest
    partitions that still have room, the largest item to the lightest.
    Counts differ by at most one."""
    w = as_weights(seqlen_list)
    _check_k(w.size, k_partitions)
    return _to_lists(_greedy_assign(w, k_partitions), k_partitions)


def _greedy_assign(w: np.ndarray, k: int) -> np.ndarray:
    n = w.size
    floor, extra = divmod(n, k)  # only ``extra`` partitions may take floor + 1 items
    order = np.argsort(-w)
    assign = np.empty(n, dtype=np.int64)
    loads = np.zeros(k)
    counts = np.zeros(k, dtype=np.int64)
    batch = max(1, 3 * k // 4)
    start = 0
    while start < n:
        cand = np.argsort(loads, kind="stable")
        if counts.max() >= floor:
            # full partitions drop out; at most ``extra`` may pass ``floor``
            c = counts[cand]
            promote = c == floor
            room = extra - np.count_nonzero(counts > floor)
            cand = cand[(c < floor) | (promote & (np.cumsum(promote) <= room))]
        targets = cand[: min(batch, n - start)]
        items = order[start:start + targets.size]
        assign[items] = targets
        loads[targets] += w[items]
        counts[targets] += 1
        start += targets.size
    return assign


def karmarkar_karp(seqlen_list, k_partitions: int, equal_size: bool) -> List[List[int]]:
    """Largest differencing method (Karmarkar-Karp) for k-way partitioning.

    A state holds k partial partitions sorted by load. The two states with the
    largest spread are merged by pairing the heaviest set of one with the
    lightest set of the other, until one state is left. With ``equal_size``
    the start states are the sorted items dealt k at a time, which keeps counts
    within one of each other.
    """
    w = as_weights(seqlen_list)
    _check_k(w.size, k_partitions)
    return _to_lists(_kk_assign(w, k_partitions, equal_size), k_partitions)


def _kk_assign(w: np.ndarray, k: int, equal_size: bool) -> np.ndarray:
    n = w.size
    order = np.argsort(-w, kind="stable")
    step = k if equal_size else 1
    chunks = [order[s:s + step] for s in range(0, n, step)]
    # Set nodes: 0..n-1 are single items, n is "empty", later ids are merges.
    empty = n
    merges = len(chunks) - 1
    left = np.full(n + 1 + merges * k, empty, dtype=np.int64)
    right = left.copy()
    heap = []
    for tick, chunk in enumerate(chunks):
        sums = np.zeros(k)
        sums[: chunk.size] = w[chunk]
        nodes = np.full(k, empty, dtype=np.int64)
        nodes[: chunk.size] = chunk
        heap.append((-(sums[0] - sums[-1]), -sums[0], tick, sums, nodes))
    heapq.heapify(heap)
    for m in range(merges):
        _, _, _, sums_a, nodes_a = heapq.heappop(heap)
        _, _, _, sums_b, nodes_b = heapq.heappop(heap)
        new_ids = np.arange(n + 1 + m * k, n + 1 + (m + 1) * k)
        left[new_ids] = nodes_a
        right[new_ids] = nodes_b[::-1]
        sums = sums_a + sums_b[::-1]
        rank = np.argsort(-sums, kind="stable")
        heapq.heappush(heap, (-(sums[rank[0]] - sums[rank[-1]]), -sums[rank[0]], len(chunks) + m,
                              sums[rank], new_ids[rank]))
    # push partition labels from the final sets down to the items
    label = np.full(left.size, -1, dtype=np.int64)
    label[heap[0][4]] = np.arange(k)
    for m in range(merges - 1, -1, -1):
        block = np.arange(n + 1 + m * k, n + 1 + (m + 1) * k)
        label[left[block]] = label[block]
        label[right[block]] = label[block]
    return label[:n]


# ---------------------------------------------------------------- default


def _score(w, assign, k):
    loads = np.bincount(assign, weights=w, minlength=k)
    return loads.max(), loads.max() - loads.min()


def _balanced_assign(w: np.ndarray, k: int, equal_size: bool) -> np.ndarray:
    """Our default: greedy (batched and heap LPT) and Karmarkar-Karp starts
    refined by local search. A start already within ``_TOL`` of the lower
    bound ends the search early. Small inputs refine every start and keep the
    best; larger ones refine only the better start (nearly as good at half the
    cost). Tiny inputs then get a bounded exact search."""
    n = w.size
    lo, hi = _count_bounds(n, k, equal_size)
    target = load_lower_bound(w, k, lo) * (1.0 + _TOL)
    makers = []
    if equal_size:
        makers.append(lambda: _greedy_assign(w, k))
    if (n * 8 if equal_size else n * k) <= _KK_START_LIMIT:
        makers.append(lambda: _kk_assign(w, k, equal_size))
    if not equal_size or (n % k == 0 and n <= _HEAP_START_ITEMS):
        makers.insert(0 if not equal_size else len(makers), lambda: _to_assign(heapq_partition(w, k, equal_size), n))
    starts = []
    for make in makers:
        starts.append(make())
        if _score(w, starts[-1], k)[0] <= target:
            return starts[-1]
    starts.sort(key=lambda a: _score(w, a, k))
    if n > _REFINE_ALL_LIMIT:
        starts = starts[:1]
    best, best_score = None, None
    work = int(DEFAULT_WORK * min(1.0, _FULL_WORK_ITEMS / n))
    for assign in starts:
        refine_assignment(w, assign, k, min_count=lo, max_count=hi, work=work, tol=_TOL)
        score = _score(w, assign, k)
        if best is None or score < best_score:
            best, best_score = assign, score
    if equal_size and n <= _EXACT_ITEMS and best_score[0] > load_lower_bound(w, k, lo):
        exact = exact_equal_partition(w, k, upper=best_score[0])
        if exact is not None:
            best = exact
    return best


def get_seqlen_balanced_partitions(seqlen_list, k_partitions: int, equal_size: bool,
                                   method: str = "auto") -> List[List[int]]:
    """Split items into ``k_partitions`` lists of indices with near-equal load.

    Parameters:
        seqlen_list: per-item workload (sequence length, or any non-negative cost).
        k_partitions: number of partitions (1 <= k <= number of items).
        equal_size: if True, partition sizes differ by at most one item (equal
            when k divides the item count); otherwise sizes are free (non-zero).
        method: "auto" (default: best of refined greedy / Karmarkar-Karp),
            "heapq", "karmarkar_karp" or "greedy" (unrefined baselines).
    Returns:
        k lists of item indices, each sorted ascending; every index appears once.
    """
    w = as_weights(seqlen_list)
    n = w.size
    _check_k(n, k_partitions)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "auto":
        assign = _balanced_assign(w, k_partitions, equal_size)
    elif method == "greedy":
        assign = _greedy_assign(w, k_partitions) if equal_size else _to_assign(
            heapq_partition(w, k_partitions, False), n)
    elif method == "heapq":
        assign = _to_assign(heapq_partition(w, k_partitions, equal_size), n)
    else:
        assign = _kk_assign(w, k_partitions, equal_size)
    if np.any(assign < 0):
        raise RuntimeError("balancer left an item unassigned")
    return _to_lists(assign, k_partitions)


# ---------------------------------------------------------------- micro-batches


def _first_fit_decreasing(w: np.ndarray, cap: float) -> np.ndarray:
    """Feasible packing: each item, largest first, into the first bin it fits."""
    order = np.argsort(-w, kind="stable")
    remaining = np.full(w.size, cap, dtype=np.float64)
    assign = np.empty(w.size, dtype=np.int64)
    used = 0
    for i in order:
        fits = remaining[:used] >= w[i]
        b = int(np.argmax(fits)) if used and fits.any() else used
        used = max(used, b + 1)
        remaining[b] -= w[i]
        assign[i] = b
    return assign


def _split_to(assign: np.ndarray, w: np.ndarray, m: int) -> np.ndarray:
    """Grow a feasible packing to exactly ``m`` non-empty bins by moving the
    largest item of the fullest multi-item bin into a new bin."""
    used = int(assign.max()) + 1
    while used < m:
        counts = np.bincount(assign, minlength=used)
        loads = np.bincount(assign, weights=w, minlength=used)
        multi = np.flatnonzero(counts > 1)
        src = multi[np.argmax(loads[multi])]
        members = np.flatnonzero(assign == src)
        assign[members[np.argmax(w[members])]] = used
        used += 1
    return assign


def rearrange_micro_batches(seqlen_list, max_token_len: int,
                            min_num_micro_batches: Optional[int] = None) -> List[List[int]]:
    """Group items into micro-batches whose token sums never exceed ``max_token_len``.

    Uses as few micro-batches as this search finds (at least the lower bound
    ``ceil(total / max_token_len)``, never more than first-fit-decreasing needs),
    or ``min_num_micro_batches`` if larger (e.g. the maximum over DP ranks from
    ``dist_sync.sync_micro_batch_count``), with loads balanced among them. If
    that minimum exceeds the number of items, each item gets its own
    micro-batch and the rest are empty lists (no-op passes for the caller).
    """
    w = as_weights(seqlen_list)
    n = w.size
    if max_token_len is None or max_token_len <= 0:
        raise ValueError(f"max_token_len must be positive, got {max_token_len}")
    if n == 0:
        raise ValueError("seqlen_list is empty: nothing to arrange into micro-batches")
    if w.max() > max_token_len:
        bad = int(np.argmax(w))
        raise ValueError(f"item {bad} has length {w[bad]:g} > max_token_len {max_token_len}")
    if min_num_micro_batches is not None and min_num_micro_batches > n:
        # fewer items here than the synced count: one item each, then empty
        # micro-batches that the caller runs as no-op passes
        return [[i] for i in np.argsort(-w, kind="stable").tolist()] + [[] for _ in range(min_num_micro_batches - n)]
    ffd = _first_fit_decreasing(w, max_token_len)
    ffd_count = int(ffd.max()) + 1
    floor = max(int(np.ceil(w.sum() / max_token_len)), 1, min_num_micro_batches or 1)
    for m in range(floor, max(ffd_count, floor) + 1):
        assign = _balanced_assign(w, m, equal_size=False)
        if np.bincount(assign, weights=w, minlength=m).max() <= max_token_len:
            return _to_lists(assign, m)
        if m >= ffd_count:
            # A balanced split can overshoot the cap; refine a feasible packing
            # instead: local search never raises the heaviest load.
            assign = _split_to(ffd, w, m)
            refine_assignment(w, assign, m, min_count=1)
            return _to_lists(assign, m)
    raise RuntimeError("unreachable: first-fit-decreasing count bounds the search")


# ---------------------------------------------------------------- statistics


def sized_lower_bound(weights, k_partitions: int, equal_size: bool = True) -> float:
    """A lower bound on the heaviest load that also counts item-count limits
    and the pigeonhole principle (see ``partition_refine.load_lower_bound``);
    tighter than ``max(mean, largest item)``."""
    w = as_weights(weights, "weights")
    _check_k(w.size, k_partitions)
    return load_lower_bound(w, k_partitions, w.size // k_partitions if equal_size else 1)


def imbalance(loads) -> float:
    """max / mean - 1 of per-rank (or per-share) loads; 0 when they are all zero (the one definition)."""
    arr = np.asarray(loads, dtype=np.float64)
    mean = float(arr.mean())
    return float(arr.max()) / mean - 1.0 if mean > 0 else 0.0


def balance_key(consumer: str, stat: str) -> str:
    """``dp_balance/<consumer>/<stat>``: the key of every DP-balance record (the one definition)."""
    return f"dp_balance/{consumer}/{stat}"


def balance_stats(weights, partitions: Sequence[Sequence[int]]) -> Dict[str, object]:
    """Per-partition loads and how far the heaviest is from the ideal.

    ``imbalance`` = max / mean - 1; ``gap`` = max / lower_bound - 1 with
    ``lower_bound`` = max(mean, largest item).
    """
    w = as_weights(weights, "weights")
    if not partitions:
        raise ValueError("partitions is empty")
    loads = np.array([w[np.asarray(p, dtype=np.int64)].sum() if len(p) else 0.0 for p in partitions])
    mean = float(w.sum() / len(partitions))
    lower = max(mean, float(w.max()) if w.size else 0.0)
    top = float(loads.max())
    return {
        "loads": loads.tolist(),
        "counts": [len(p) for p in partitions],
        "max": top,
        "min": float(loads.min()),
        "mean": mean,
        "imbalance": imbalance(loads),
        "lower_bound": lower,
        "gap": top / lower - 1.0 if lower > 0 else 0.0,
    }
