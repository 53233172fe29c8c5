"""exact_equal_partition: optimal equal-size partitions, the upper bound, the node budget."""
import itertools

import numpy as np
import pytest

from mindspeed_rl.balance.partition_exact import exact_equal_partition


def _brute_best(w, k):
    """Smallest heaviest load over all equal-size assignments (tiny inputs)."""
    n = len(w)
    size = n // k
    best = float("inf")
    for labels in itertools.product(range(k), repeat=n):
        if any(labels.count(p) != size for p in range(k)):
            continue
        loads = [sum(w[i] for i in range(n) if labels[i] == p) for p in range(k)]
        best = min(best, max(loads))
    return best


def _max_load(w, assign, k):
    return max(float(np.sum(np.asarray(w, dtype=float)[assign == p])) for p in range(k))


def test_not_divisible_gives_none():
    assert exact_equal_partition([1, 2, 3], 2, upper=100.0) is None


@pytest.mark.parametrize("w,k", [
    ([8, 7, 6, 5, 4, 3], 2),
    ([10, 1, 1, 1, 9, 2], 3),
    ([5, 5, 4, 3, 3, 1, 1, 2], 2),
    ([9, 8, 2, 2, 1, 1, 7, 3], 4),
    ([3, 3, 3, 3], 2),
    ([6, 1, 5, 2, 4, 3], 3),
])
def test_optimal_and_equal_sizes(w, k):
    assign = exact_equal_partition(w, k, upper=float(sum(w)) + 1)
    assert assign is not None
    assert assign.dtype == np.int64 and assign.shape == (len(w),)
    assert sorted(np.bincount(assign, minlength=k).tolist()) == [len(w) // k] * k
    assert set(assign.tolist()) == set(range(k))
    assert _max_load(w, assign, k) == pytest.approx(_brute_best(w, k))


def test_items_sorted_heaviest_first_and_groups_numbered_in_order():
    # the heaviest item opens group 0, the heaviest left over opens group 1
    assign = exact_equal_partition([1, 9, 2, 8], 2, upper=100.0)
    assert assign.tolist() == [0, 0, 1, 1]


def test_upper_at_optimum_gives_none():
    w = [8, 7, 6, 5, 4, 3]  # optimum 17 (8+6+3 / 7+5+4 or similar)
    assert _brute_best(w, 2) == 17
    assert exact_equal_partition(w, 2, upper=17.0) is None
    got = exact_equal_partition(w, 2, upper=17.5)
    assert got is not None and _max_load(w, got, 2) == 17


def test_upper_just_above_a_group_load():
    # the only group load below upper must be strictly below: 5 + 5 = 10 ties the bound
    assert exact_equal_partition([5, 5, 5, 5], 2, upper=10.0) is None
    assert exact_equal_partition([5, 5, 5, 5], 2, upper=10.01) is not None


def test_single_partition():
    got = exact_equal_partition([3, 1, 2], 1, upper=7.0)
    assert got.tolist() == [0, 0, 0]
    assert exact_equal_partition([3, 1, 2], 1, upper=6.0) is None


def test_one_item_per_partition():
    got = exact_equal_partition([4, 2, 7], 3, upper=8.0)
    assert sorted(got.tolist()) == [0, 1, 2]
    assert got.tolist() == [1, 2, 0]
    assert exact_equal_partition([4, 2, 7], 3, upper=7.0) is None


def test_mean_bound_prunes_but_keeps_optimum():
    # optimum equals the mean load: the mean-based prune must use >=, not reject it
    w = [4, 3, 2, 1, 4, 3, 2, 1]
    got = exact_equal_partition(w, 2, upper=11.0)
    assert got is not None and _max_load(w, got, 2) == 10


def test_node_budget_exhausted_gives_none():
    rng = np.random.default_rng(0)
    w = rng.integers(1, 1000, size=16).tolist()
    assert exact_equal_partition(w, 4, upper=float(sum(w)), node_limit=1) is None
    assert exact_equal_partition(w, 4, upper=float(sum(w)), node_limit=0) is None


def test_node_budget_counts_candidate_groups():
    # 6 items into 2 groups: the first node plus 10 candidate groups for the opener,
    # enough budget to reach a full assignment only when candidates are counted loosely
    w = [8, 7, 6, 5, 4, 3]
    full = exact_equal_partition(w, 2, upper=100.0)
    assert full is not None
    counts = []
    for limit in range(1, 40):
        got = exact_equal_partition(w, 2, upper=100.0, node_limit=limit)
        counts.append(got is not None)
    first = counts.index(True) + 1
    # root, one candidate, the child node, its candidate, the leaf: five nodes
    assert first == 5
    assert all(counts[first - 1:])


def test_budget_stops_with_best_so_far():
    # a budget that finds a first assignment but not the optimum returns a valid one
    w = [10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 1, 1]
    got = exact_equal_partition(w, 3, upper=1000.0, node_limit=8)
    assert got is not None
    assert sorted(np.bincount(got, minlength=3).tolist()) == [4, 4, 4]
    best = exact_equal_partition(w, 3, upper=1000.0)
    assert _max_load(w, best, 3) <= _max_load(w, got, 3)
    assert _max_load(w, best, 3) == pytest.approx(19.0)


def test_numpy_and_float_weights():
    w = np.array([2.5, 0.5, 1.5, 1.5])
    got = exact_equal_partition(w, 2, upper=10.0)
    assert _max_load(w, got, 2) == pytest.approx(3.0)


def test_default_budget_solves_moderate_input():
    rng = np.random.default_rng(3)
    w = rng.integers(1, 50, size=8).tolist()
    got = exact_equal_partition(w, 2, upper=float(sum(w)) + 1)
    assert _max_load(w, got, 2) == pytest.approx(_brute_best(w, 2))


def test_small_weights_below_one():
    # loads under 1.0 are valid: neither the start load nor the leaf bound may be 1
    got = exact_equal_partition([0.2, 0.1, 0.3, 0.4], 2, upper=0.9)
    assert got is not None and _max_load([0.2, 0.1, 0.3, 0.4], got, 2) == pytest.approx(0.5)
    got = exact_equal_partition([0.2, 0.3], 2, upper=0.5)
    assert got is not None and sorted(got.tolist()) == [0, 1]


def test_budget_result_ties_keep_first_found():
    # under a tight budget the search keeps the first of equal loads and skips
    # groups as heavy as the best so far (found by comparing search variants)
    w = [16, 11, 16, 7, 9, 15, 3, 6, 3]
    got = exact_equal_partition(w, 3, upper=86.0, node_limit=12)
    assert got.tolist() == [0, 1, 0, 1, 1, 0, 2, 2, 2]
    w = [3, 8, 8, 18, 4, 10]
    got = exact_equal_partition(w, 2, upper=51.0, node_limit=30)
    assert got.tolist() == [0, 1, 1, 0, 0, 1]


def test_mean_bound_saves_budget():
    # without the mean-load prune the same budget ends on a worse assignment
    w = [7, 9, 5, 8, 16, 1, 13, 14, 17]
    got = exact_equal_partition(w, 3, upper=35.40828410347032, node_limit=100)
    assert got.tolist() == [2, 2, 0, 0, 1, 1, 1, 2, 0]
