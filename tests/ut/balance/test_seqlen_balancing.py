import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from mindspeed_rl.balance.seqlen_balancing import (
    balance_stats, get_seqlen_balanced_partitions, greedy_rounds, heapq_partition,
    karmarkar_karp, rearrange_micro_batches, sized_lower_bound)
from mindspeed_rl.balance.partition_refine import load_lower_bound, refine_assignment


def _assert_cover(parts, n, k):
    assert len(parts) == k
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(n)), "every index exactly once"


def _loads(w, parts):
    w = np.asarray(w, dtype=float)
    return np.array([w[p].sum() for p in parts])


def _grpo_groups(rng, prompts, n=8, cap=8192):
    difficulty = rng.lognormal(6.5, 0.9, prompts)
    resp = np.minimum(rng.lognormal(np.log(difficulty)[:, None], 0.6, (prompts, n)), cap)
    prompt = rng.integers(64, 1024, (prompts, 1))
    return (resp + prompt).astype(int).sum(axis=1)


@pytest.mark.parametrize("method", ["auto", "heapq", "karmarkar_karp", "greedy"])
@pytest.mark.parametrize("n,k", [(8, 8), (16, 4), (96, 8), (1000, 10)])
def test_equal_size_cover_and_sizes(method, n, k):
    w = np.random.default_rng(n + k).integers(1, 5000, n)
    parts = get_seqlen_balanced_partitions(w, k, equal_size=True, method=method)
    _assert_cover(parts, n, k)
    assert {len(p) for p in parts} == {n // k}
    assert all(p == sorted(p) for p in parts)


@pytest.mark.parametrize("method", ["auto", "karmarkar_karp", "greedy"])
def test_non_divisible_counts_differ_by_at_most_one(method):
    w = np.random.default_rng(0).lognormal(6, 1, 103)
    parts = get_seqlen_balanced_partitions(w, 10, equal_size=True, method=method)
    _assert_cover(parts, 103, 10)
    sizes = sorted(len(p) for p in parts)
    assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 103


def test_heapq_partition_keeps_seed_semantics():
    w = [5, 1, 4, 2, 3, 3]
    parts = heapq_partition(w, 2, equal_size=True)
    _assert_cover([sorted(p) for p in parts], 6, 2)
    assert sorted(_loads(w, parts)) == [9, 9]
    with pytest.raises(ValueError, match="divisible"):
        heapq_partition(list(range(7)), 2, equal_size=True)


def test_free_size_partitions_are_non_empty_and_balanced():
    w = [100, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    parts = get_seqlen_balanced_partitions(w, 2, equal_size=False)
    _assert_cover(parts, 10, 2)
    assert all(parts)
    assert sorted(_loads(w, parts)) == [9, 100]  # the big item alone is optimal


def test_auto_beats_lpt_on_group_level_long_tail():
    rng = np.random.default_rng(7)
    wins, total = 0, 0
    for _ in range(10):
        w = _grpo_groups(rng, 32 * 4)
        auto = _loads(w, get_seqlen_balanced_partitions(w, 32, True)).max()
        lpt = _loads(w, heapq_partition(w, 32, True)).max()
        kk = _loads(w, karmarkar_karp(w, 32, True)).max()
        assert auto <= min(lpt, kk) + 1e-9, "never worse than the better baseline"
        wins += auto < min(lpt, kk)
        total += 1
    assert wins >= total // 2


def test_auto_reaches_the_bound_on_easy_input():
    # 4 partitions of 4 items; 1..16 pair up to 34 each (perfect split exists)
    w = np.arange(1, 17)
    loads = _loads(w, get_seqlen_balanced_partitions(w, 4, True))
    assert loads.max() == loads.min() == 34


def test_accepts_list_numpy_and_torch():
    w = [7, 3, 9, 1, 4, 4]
    expect = get_seqlen_balanced_partitions(w, 3, True)
    assert get_seqlen_balanced_partitions(np.array(w), 3, True) == expect
    assert get_seqlen_balanced_partitions(torch.tensor(w), 3, True) == expect


@pytest.mark.parametrize("bad,k,err,match", [
    ([1, 2, 3], 0, ValueError, "positive"),
    ([1, 2, 3], -1, ValueError, "positive"),
    ([1, 2, 3], 4, ValueError, "k_partitions"),
    ([1, -2, 3], 2, ValueError, "negative value -2.0 at index 1"),
    ([1, float("nan"), 3], 2, ValueError, "non-finite"),
    ([[1, 2], [3, 4]], 2, ValueError, "1-D"),
    ([1, 2, 3], 1.5, TypeError, "int"),
])
def test_bad_input_errors(bad, k, err, match):
    with pytest.raises(err, match=match):
        get_seqlen_balanced_partitions(bad, k, True)


def test_unknown_method():
    with pytest.raises(ValueError, match="method"):
        get_seqlen_balanced_partitions([1, 2], 1, True, method="magic")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=120), st.integers(1, 16),
       st.booleans())
def test_property_cover_sizes_and_no_worse_than_lpt(values, k, equal_size):
    k = min(k, len(values))
    parts = get_seqlen_balanced_partitions(values, k, equal_size)
    _assert_cover(parts, len(values), k)
    sizes = [len(p) for p in parts]
    if equal_size:
        assert max(sizes) - min(sizes) <= 1
    else:
        assert min(sizes) >= 1
    top = _loads(values, parts).max()
    assert top >= load_lower_bound(values, k) - 1e-6
    lpt_free = _loads(values, heapq_partition(values, k, False)).max()
    if not equal_size:
        assert top <= lpt_free + 1e-6
    elif len(values) % k == 0:
        assert top <= _loads(values, heapq_partition(values, k, True)).max() + 1e-6


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 500), min_size=1, max_size=80), st.integers(500, 2000))
def test_property_micro_batches_respect_cap(values, cap):
    parts = rearrange_micro_batches(values, cap)
    _assert_cover(parts, len(values), len(parts))
    assert _loads(values, parts).max() <= cap
    assert len(parts) >= int(np.ceil(sum(values) / cap))
    assert all(parts)


def test_micro_batches_reach_lower_bound_count_and_honour_minimum():
    w = np.random.default_rng(1).integers(100, 2000, 200)
    parts = rearrange_micro_batches(w, 4096)
    assert len(parts) == int(np.ceil(w.sum() / 4096))  # loose items: the bound is reachable
    more = rearrange_micro_batches(w, 4096, min_num_micro_batches=len(parts) + 5)
    assert len(more) == len(parts) + 5 and _loads(w, more).max() <= 4096


def test_micro_batches_pad_with_empty_when_minimum_exceeds_items():
    parts = rearrange_micro_batches([3, 9], 10, min_num_micro_batches=4)
    assert parts == [[1], [0], [], []]


def test_micro_batches_cap_held_where_plain_balancing_overflows():
    # balanced split into ceil(total/cap)=2 parts puts 6+... over the cap of 10
    w = [6, 6, 6, 1, 1]
    parts = rearrange_micro_batches(w, 10)
    assert _loads(w, parts).max() <= 10
    assert len(parts) == 3


@pytest.mark.parametrize("kwargs,match", [
    (dict(seqlen_list=[5, 20], max_token_len=10), "item 1 has length 20"),
    (dict(seqlen_list=[5], max_token_len=0), "positive"),
    (dict(seqlen_list=[], max_token_len=10), "empty"),
])
def test_micro_batch_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rearrange_micro_batches(**kwargs)


def test_balance_stats_values():
    stats = balance_stats([4, 4, 2, 6], [[0, 1], [2, 3]])
    assert stats["loads"] == [8.0, 8.0]
    assert stats["imbalance"] == 0.0
    stats = balance_stats([9, 1, 1, 1], [[0, 1], [2, 3]])
    assert stats["max"] == 10 and stats["min"] == 2 and stats["mean"] == 6
    assert stats["lower_bound"] == 9 and stats["gap"] == pytest.approx(10 / 9 - 1)
    assert stats["imbalance"] == pytest.approx(10 / 6 - 1)
    assert sized_lower_bound([9, 1, 1, 1], 2) == 10


def test_refine_never_raises_max_and_keeps_counts():
    rng = np.random.default_rng(3)
    w = rng.lognormal(5, 1.2, 400)
    assign = rng.integers(0, 8, 400)
    before = np.bincount(assign, w, 8).max()
    counts = np.bincount(assign, minlength=8)
    refine_assignment(w, assign, 8, min_count=counts.min(), max_count=counts.max())
    assert np.bincount(assign, w, 8).max() <= before
    assert sorted(np.bincount(assign, minlength=8)) == sorted(counts)


def test_greedy_rounds_deal_counts():
    parts = greedy_rounds(np.arange(10), 4)
    assert sorted(len(p) for p in parts) == [2, 2, 3, 3]


def _exact_min_max(w, k):
    """Brute-force optimum for equal-size partitions (tiny inputs only)."""
    c = len(w) // k
    order = sorted(range(len(w)), key=lambda i: -w[i])
    best = [float("inf")]

    def rec(rest, cur):
        if cur >= best[0]:
            return
        if not rest:
            best[0] = cur
            return
        head, tail = rest[0], rest[1:]
        for comb in itertools.combinations(tail, c - 1):
            load = w[head] + sum(w[j] for j in comb)
            rec([x for x in tail if x not in comb], max(cur, load))

    rec(order, 0)
    return best[0]


def test_auto_finds_the_exact_optimum_on_tiny_group_level_inputs():
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(10):
        w = _grpo_groups(rng, 12).tolist()
        opt = _exact_min_max(w, 4)
        got = _loads(w, get_seqlen_balanced_partitions(w, 4, True)).max()
        assert got >= opt
        hits += got == opt
    assert hits >= 9
