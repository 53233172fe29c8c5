"""partition_refine at its edges: _thin at exactly its cap, the pigeonhole term of the lower bound at
the last depth, single moves that leave one item, partitions empty at the start, and the lightest
partitions the search looks at first."""
import numpy as np

from mindspeed_rl.balance import partition_refine as pr


def test_thin_at_its_cap_keeps_the_given_order():
    assert pr._thin(np.arange(3), np.array([3.0, 1.0, 2.0]), 3).tolist() == [0, 1, 2]


def test_lower_bound_uses_the_term_of_the_last_depth():
    # depth 2, k 2: two of the three 4s share a partition (the mean says only 6)
    assert pr.load_lower_bound([4.0, 4.0, 4.0], 2, 1, depth=2) == 8.0
    # default depth 8: the deepest term covers the 15 largest items, 8 of them in one partition
    assert pr.load_lower_bound([1.0] * 17, 2) == 8.5  # the mean; a 9th term would claim 9


def test_refine_moves_an_item_out_even_if_one_stays():
    w = np.array([6.0, 1.0])
    assign = pr.refine_assignment(w, np.array([0, 0]), 2)  # default min_count 1
    assert sorted(np.bincount(assign, weights=w, minlength=2).tolist()) == [1.0, 6.0]


def test_refine_fills_partitions_empty_at_the_start():
    w = np.array([3.0, 2.0, 2.0, 2.0, 1.0])
    assign = pr.refine_assignment(w, np.zeros(5, dtype=np.int64), 2)
    assert np.bincount(assign, weights=w, minlength=2).tolist() == [5.0, 5.0]
    w = np.array([3.0, 3.0, 3.0])
    assign = pr.refine_assignment(w, np.zeros(3, dtype=np.int64), 3)
    assert sorted(assign.tolist()) == [0, 1, 2]


def test_search_looks_at_the_lightest_other_partitions_lightest_first():
    w = np.array([10.0, 1.0, 9.0, 2.0, 3.0])
    s = pr._Search(w, np.arange(5), 5, 1, 5, pr.DEFAULT_WORK)
    assert s._parts(0, 3).tolist() == [1, 3, 4]
    assert s._parts(1, 2).tolist() == [3, 4]
    assert s._parts(0, 5).tolist() == [1, 3, 4, 2]  # a limit past k - 1: all others


def test_search_thins_partitions_of_more_than_256_items():
    """Both the heaviest partition (400 items) and the candidates (300) are thinned to a sample."""
    w = np.random.default_rng(1).integers(1, 100, 700).astype(float)
    start = np.repeat([0, 1], [400, 300])
    before = np.bincount(start, weights=w, minlength=2).max()
    assign = pr.refine_assignment(w, start.copy(), 2, work=150_000)  # one phase-1 round, one search step
    loads = np.bincount(assign, weights=w, minlength=2)
    assert loads.sum() == w.sum() and loads.max() < before
