"""seqlen_balancing at its edges: tensors that need grad, statistics below one token and of nothing,
free-size greedy, a cap of one token, first-fit with fractional lengths, index helpers with empty
partitions, and inputs above the refine-all limit."""
import numpy as np
import pytest
import torch

from mindspeed_rl.balance import seqlen_balancing as sb


def test_weights_from_a_tensor_that_needs_grad():
    assert sb.as_weights(torch.tensor([1.0, 2.0], requires_grad=True)).tolist() == [1.0, 2.0]


def test_statistics_name_their_weights_argument():
    with pytest.raises(ValueError, match=r"^weights has a negative value -1.0 at index 0$"):
        sb.balance_stats([-1.0], [[0]])


def test_statistics_of_loads_below_one():
    st = sb.balance_stats([0.5, 0.25], [[0, 1], []])
    assert st["lower_bound"] == 0.5 and st["gap"] == pytest.approx(0.5)
    assert sb.imbalance([0.5, 1.0]) == pytest.approx(1.0 / 0.75 - 1.0)


def test_statistics_of_nothing():
    st = sb.balance_stats([], [[]])
    assert st["lower_bound"] == 0.0 and st["gap"] == 0.0 and st["loads"] == [0.0]


def test_free_size_greedy_is_the_heap_lpt():
    # counts may differ: the 10 stays alone (count-balanced greedy would give it a 1)
    assert sb.get_seqlen_balanced_partitions([10, 1, 1, 1], 2, equal_size=False, method="greedy") == [[0], [1, 2, 3]]


def test_a_cap_of_one_token():
    assert sorted(sb.rearrange_micro_batches([1, 1], 1)) == [[0], [1]]


def test_first_fit_decreasing_with_fractional_lengths():
    # 0.6 + 0.4 fill a bin of 1 exactly: two bins
    assert sb._first_fit_decreasing(np.array([0.6, 0.6, 0.4, 0.4]), 1).tolist() == [0, 1, 0, 1]


def test_index_helpers_with_empty_partitions():
    assert sb._to_lists(np.array([0, 0]), 3) == [[0, 1], [], []]
    assert sb._to_assign([[0, 1], []], 2).tolist() == [0, 0]
    assert sb._to_assign([[1]], 2).tolist() == [-1, 0]  # an item in no partition stays -1


def test_above_the_refine_all_limit():
    w = np.round(np.random.default_rng(3).pareto(1.2, 600) * 50 + 1)
    parts = sb.get_seqlen_balanced_partitions(w, 7, equal_size=True)  # no start within the bound: refine one
    assert sorted(i for p in parts for i in p) == list(range(600))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert max(w[p].sum() for p in parts) <= sb.sized_lower_bound(w, 7) * 1.01


def test_micro_batches_may_fill_the_cap_exactly():
    # first-fit-decreasing needs 4 bins; three of exactly 10 tokens ([4, 3, 3] each) exist
    mbs = sb.rearrange_micro_batches([4, 4, 4, 3, 3, 3, 3, 3, 3], 10)
    assert len(mbs) == 3 and all(sum([4, 4, 4, 3, 3, 3, 3, 3, 3][i] for i in p) == 10 for p in mbs)
