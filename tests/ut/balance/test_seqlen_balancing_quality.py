"""Balancer and micro-batch results on recorded inputs (random lengths: uniform, few distinct, heavy-tailed;
every method, equal and free sizes): the heaviest partition, and the micro-batch count and heaviest
micro-batch, must not get worse than recorded here. The inputs are ones where a weaker start, bound or
packing ends heavier."""
import numpy as np
import pytest

from mindspeed_rl.balance import seqlen_balancing as sb

# (lengths, k, equal_size, method, heaviest partition reached)
PARTITIONS = [
    ([101, 155, 50, 13, 76, 5, 3, 14, 6, 54, 103, 30, 1, 818, 39, 24], 3, True, 'greedy', 833),
    ([2, 3, 2, 3, 2, 2, 2, 1, 2, 2], 3, False, 'karmarkar_karp', 7),
]
# (lengths, max_token_len, min_num_micro_batches, micro-batches, heaviest micro-batch)
MICRO_BATCHES = [
    ([3, 19, 19, 5, 39, 17, 2, 10, 41, 37, 23, 32, 32, 25, 38, 1, 39, 48, 27, 1, 40, 26, 4, 22, 4, 13, 30, 44, 49, 17, 18, 28, 36, 7, 19], 52, None, 17, 52),
    ([47, 18, 29, 10, 43, 35, 33, 27, 14, 36, 39, 3, 19, 9, 29, 16, 6, 23, 7, 28, 35, 28, 24, 27, 29, 28, 11, 21], 65, 2, 11, 62),
    ([40, 7, 33, 43, 42, 36, 49, 37, 32, 20, 30, 3, 15, 34, 22, 48, 25, 33, 19, 12, 45, 27, 7, 6, 11, 36, 20, 33, 17, 22, 5, 1, 28, 3, 28, 34, 45, 34], 67, 5, 15, 66),
    ([16, 36, 10, 21, 18, 49, 9], 61, None, 3, 56),
]


@pytest.mark.parametrize("w, k, equal_size, method, reached", PARTITIONS)
def test_partitions_reach_the_recorded_load(w, k, equal_size, method, reached):
    parts = sb.get_seqlen_balanced_partitions(w, k, equal_size, method=method)
    assert len(parts) == k and sorted(i for p in parts for i in p) == list(range(len(w)))
    counts = [len(p) for p in parts]
    assert min(counts) >= 1 and (not equal_size or max(counts) - min(counts) <= 1)
    assert max(np.asarray(w, dtype=float)[p].sum() for p in parts) <= reached


@pytest.mark.parametrize("w, cap, minimum, count, reached", MICRO_BATCHES)
def test_micro_batches_reach_the_recorded_count_and_load(w, cap, minimum, count, reached):
    mbs = sb.rearrange_micro_batches(w, cap, minimum)
    assert sorted(i for p in mbs for i in p) == list(range(len(w)))
    loads = [float(np.asarray(w, dtype=float)[p].sum()) for p in mbs if p]
    assert max(loads) <= cap and len(mbs) >= (minimum or 1)
    assert len(mbs) < count or (len(mbs) == count and max(loads) <= reached)
