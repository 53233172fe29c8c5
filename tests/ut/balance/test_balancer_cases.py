"""The balancer on small inputs worked by hand: each start's exact split (heap LPT, Karmarkar-Karp,
batched greedy), the method switch, micro-batch packing, the bounds and statistics, and what bad
input is told."""
import itertools

import numpy as np
import pytest
import torch

from mindspeed_rl.balance import seqlen_balancing as sb


def _loads(w, parts):
    return sorted(sum(w[i] for i in p) for p in parts)


def _optimum(w, k, equal_size):
    """Smallest heaviest load over all splits (brute force, tiny inputs)."""
    n, best = len(w), float("inf")
    lo, hi = (n // k, -(-n // k)) if equal_size else (1, n)
    for labels in itertools.product(range(k), repeat=n):
        counts = np.bincount(labels, minlength=k)
        if counts.min() < lo or counts.max() > hi:
            continue
        best = min(best, np.bincount(labels, weights=w, minlength=k).max())
    return best


# ------------------------------------------------------------------ starts, exact


def test_heap_lpt_takes_the_lightest_partition_with_room():
    assert sb.heapq_partition([5, 4, 3, 2, 1], 2, False) == [[0, 3, 4], [1, 2]]
    # equal sizes: a partition with n / k items leaves the heap (ties: fewer items, then lower index)
    assert sb.heapq_partition([5, 4, 3, 2, 1, 1], 2, True) == [[0, 3, 4], [1, 2, 5]]
    assert sb.heapq_partition([5, 4, 3, 2, 1, 1], 3, True) == [[0, 5], [1, 4], [2, 3]]
    with pytest.raises(ValueError, match=r"^equal_size needs len\(seqlen_list\)=5 divisible by k_partitions=2$"):
        sb.heapq_partition([5, 4, 3, 2, 1], 2, True)


def test_karmarkar_karp_differencing():
    # 8,7,6,5,4: 8-7 -> 1; 6-5 -> 1; 4-1 -> 3; 3-1 -> 2: the classic difference of 2 (the optimum is 0)
    parts = sb.karmarkar_karp([8, 7, 6, 5, 4], 2, False)
    assert parts == [[1, 3, 4], [0, 2]] and _loads([8, 7, 6, 5, 4], parts) == [14, 16]
    # equal sizes: items dealt k at a time, sets of two states merged heaviest to lightest
    assert sb.karmarkar_karp([8, 7, 6, 5, 4, 3], 2, True) == [[1, 2, 4], [0, 3, 5]]
    parts = sb.karmarkar_karp([8, 7, 6, 5, 4, 3, 2], 3, False)
    assert parts == [[2, 3, 6], [1, 4], [0, 5]] and _loads([8, 7, 6, 5, 4, 3, 2], parts) == [11, 11, 13]


def test_karmarkar_karp_on_one_item_per_partition():
    assert sb.karmarkar_karp([3, 9, 1], 3, True) == [[1], [0], [2]]
    assert sb.karmarkar_karp([4, 4], 1, False) == [[0, 1]]


def test_batched_greedy_deals_largest_first_to_the_lightest():
    assert sb.greedy_rounds([9, 8, 7, 6, 5, 4, 3, 2, 1], 4) == [[0, 7], [1, 5, 8], [2, 4], [3, 6]]
    assert sb.greedy_rounds([9, 8, 7, 6, 5, 4, 3, 2, 1, 0], 3) == [[0, 5, 7, 9], [1, 3, 8], [2, 4, 6]]
    assert sb.greedy_rounds([1, 2, 3], 1) == [[0, 1, 2]]


@pytest.mark.parametrize("n, k", [(7, 3), (10, 4), (5, 5), (9, 2), (13, 5)])
def test_batched_greedy_counts_differ_by_at_most_one(n, k):
    w = np.random.default_rng(n * 31 + k).integers(1, 50, n)
    counts = sorted(len(p) for p in sb.greedy_rounds(w, k))
    assert counts == sorted([n // k + 1] * (n % k) + [n // k] * (k - n % k))


# ------------------------------------------------------------------ the method switch


def test_methods_dispatch_to_their_start():
    w = [8, 7, 6, 5, 4]
    assert sb.get_seqlen_balanced_partitions(w, 2, False, method="heapq") == sb.heapq_partition(w, 2, False)
    assert sb.get_seqlen_balanced_partitions(w, 2, False, method="karmarkar_karp") == [[1, 3, 4], [0, 2]]
    # greedy: the batched greedy with equal sizes, heap LPT with free sizes
    assert sb.get_seqlen_balanced_partitions(w, 2, False, method="greedy") == [[0, 3, 4], [1, 2]]
    w6 = [8, 7, 6, 5, 4, 3]
    assert sb.get_seqlen_balanced_partitions(w6, 2, True, method="greedy") == sb.greedy_rounds(w6, 2)
    assert sb.get_seqlen_balanced_partitions(w, 2, False) == [[2, 3, 4], [0, 1]]  # auto: the optimum 15 / 15
    with pytest.raises(ValueError, match=r"^method must be one of \('auto', 'heapq', 'karmarkar_karp', 'greedy'\), "
                                         r"got 'lpt'$"):
        sb.get_seqlen_balanced_partitions(w, 2, False, method="lpt")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n, k, equal_size", [(7, 2, True), (7, 3, False), (8, 3, True), (6, 4, False)])
def test_auto_is_optimal_on_tiny_inputs(seed, n, k, equal_size):
    w = np.random.default_rng(seed).integers(1, 40, n).astype(float)
    parts = sb.get_seqlen_balanced_partitions(w, k, equal_size)
    assert sorted(i for p in parts for i in p) == list(range(n)) and all(p == sorted(p) for p in parts)
    if equal_size:
        assert {len(p) for p in parts} <= {n // k, -(-n // k)}
    assert max(_loads(w, parts)) == _optimum(w, k, equal_size)


def test_auto_on_larger_inputs_stays_near_the_bound():
    rng = np.random.default_rng(0)
    for n, k in ((600, 8), (2000, 16)):
        w = rng.integers(1, 4096, n).astype(float)
        parts = sb.get_seqlen_balanced_partitions(w, k, True)
        assert {len(p) for p in parts} == {n // k} and sorted(i for p in parts for i in p) == list(range(n))
        assert max(_loads(w, parts)) <= sb.sized_lower_bound(w, k) * (1 + 1e-3)


# ------------------------------------------------------------------ micro-batches


def test_micro_batches_use_the_fewest_bins_with_balanced_loads():
    parts = sb.rearrange_micro_batches([5, 4, 3, 3, 2], 7)
    assert parts == [[0], [1, 4], [2, 3]]
    assert sb.rearrange_micro_batches([3, 3, 3], 9) == [[0, 1, 2]]
    assert sb.rearrange_micro_batches([6, 6], 6) == [[0], [1]]  # an item exactly at the cap


def test_micro_batches_minimum_above_the_item_count():
    assert sb.rearrange_micro_batches([5, 4, 6], 100, min_num_micro_batches=5) == [[2], [0], [1], [], []]
    assert sorted(sb.rearrange_micro_batches([5, 4, 6], 100, min_num_micro_batches=3)) == [[0], [1], [2]]
    assert len(sb.rearrange_micro_batches([5, 4, 6], 100, min_num_micro_batches=2)) == 2


def test_micro_batches_when_balancing_overshoots_the_cap():
    """7 items whose balanced 3-way split overflows a cap of 10: first-fit packs them; the packing is
    split to the bin count and refined without passing the cap."""
    w = [6, 5, 5, 4, 4, 3, 3]
    parts = sb.rearrange_micro_batches(w, 10)
    assert len(parts) == 3 and max(_loads(w, parts)) <= 10
    assert sorted(i for p in parts for i in p) == list(range(7))
    parts = sb.rearrange_micro_batches(w, 10, min_num_micro_batches=4)
    assert len(parts) == 4 and all(parts) and max(_loads(w, parts)) <= 10


def test_split_to_moves_the_largest_item_of_the_fullest_bin():
    w = np.array([5.0, 1.0, 4.0, 2.0])
    assign = np.array([0, 0, 1, 1])
    assert sb._split_to(assign.copy(), w, 3).tolist() == [2, 0, 1, 1]
    assert sb._split_to(assign.copy(), w, 4).tolist() == [2, 0, 3, 1]


def test_first_fit_decreasing():
    assert sb._first_fit_decreasing(np.array([4.0, 7.0, 3.0, 6.0]), 10).tolist() == [1, 0, 0, 1]


@pytest.mark.parametrize("kwargs, error", [
    ({"seqlen_list": [1, 2], "max_token_len": 0}, "^max_token_len must be positive, got 0$"),
    ({"seqlen_list": [1, 2], "max_token_len": None}, "^max_token_len must be positive, got None$"),
    ({"seqlen_list": [], "max_token_len": 4}, "^seqlen_list is empty: nothing to arrange into micro-batches$"),
    ({"seqlen_list": [3, 9, 2], "max_token_len": 8}, "^item 1 has length 9 > max_token_len 8$"),
])
def test_micro_batch_errors_name_the_problem(kwargs, error):
    with pytest.raises(ValueError, match=error):
        sb.rearrange_micro_batches(**kwargs)


# ------------------------------------------------------------------ bounds and statistics


def test_sized_lower_bound_counts_item_limits():
    assert sb.sized_lower_bound([10, 1, 1, 1], 2) == 11.0           # the 10 needs a second item
    assert sb.sized_lower_bound([10, 1, 1, 1], 2, equal_size=False) == 10.0
    assert sb.sized_lower_bound([5, 5, 5, 1], 2) == 10.0            # two of the three 5s share a partition
    with pytest.raises(ValueError, match="weights has a negative value"):
        sb.sized_lower_bound([1, -1], 1)


def test_imbalance():
    assert sb.imbalance([2, 2, 2]) == 0.0
    assert sb.imbalance([3, 1]) == pytest.approx(0.5)
    assert sb.imbalance([0, 0]) == 0.0


def test_balance_stats_hand_values():
    s = sb.balance_stats([1, 2, 3, 10], [[0, 3], [1, 2]])
    assert s == {"loads": [11.0, 5.0], "counts": [2, 2], "max": 11.0, "min": 5.0, "mean": 8.0,
                 "imbalance": pytest.approx(11 / 8 - 1), "lower_bound": 10.0, "gap": pytest.approx(0.1)}
    s = sb.balance_stats([2, 2], [[0], [1], []])
    assert s["loads"] == [2.0, 2.0, 0.0] and s["counts"] == [1, 1, 0] and s["min"] == 0.0
    assert s["mean"] == pytest.approx(4 / 3) and s["lower_bound"] == 2.0 and s["gap"] == 0.0
    zero = sb.balance_stats([0, 0], [[0], [1]])
    assert (zero["gap"], zero["imbalance"], zero["lower_bound"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="^partitions is empty$"):
        sb.balance_stats([1], [])


# ------------------------------------------------------------------ input checks


def test_weights_from_lists_arrays_and_tensors():
    for values in ([3, 1], np.array([3, 1], dtype=np.int32), torch.tensor([3, 1]), torch.tensor([3.0, 1.0])):
        w = sb.as_weights(values)
        assert w.dtype == np.float64 and w.tolist() == [3.0, 1.0]
    assert sb.as_weights([]).size == 0


@pytest.mark.parametrize("values, error", [
    ([[1, 2]], r"^seqlen_list must be 1-D, got shape \(1, 2\)$"),
    ([1, float("nan"), 2], r"^seqlen_list has a non-finite value at index 1$"),
    ([1, 2, float("inf")], r"^seqlen_list has a non-finite value at index 2$"),
    ([1, -2, -3], r"^seqlen_list has a negative value -3.0 at index 2$"),
])
def test_bad_weights_name_the_index(values, error):
    with pytest.raises(ValueError, match=error):
        sb.as_weights(values)


@pytest.mark.parametrize("k, kind, error", [
    (2.0, TypeError, "^k_partitions must be an int, got float$"),
    (True, TypeError, "^k_partitions must be an int, got bool$"),
    (0, ValueError, "^k_partitions must be positive, got 0$"),
    (4, ValueError, r"^number of items:\[3\] < k_partitions:\[4\]$"),
])
def test_bad_partition_count(k, kind, error):
    with pytest.raises(kind, match=error):
        sb.get_seqlen_balanced_partitions([1, 2, 3], k, False)


def test_numpy_integer_partition_count_is_accepted():
    assert sorted(sb.get_seqlen_balanced_partitions([1, 2, 3], np.int64(3), True)) == [[0], [1], [2]]
