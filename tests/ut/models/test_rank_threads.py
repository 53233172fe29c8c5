"""The ranks-as-threads harness the sharded tests stand on: real collectives, errors named by rank."""
import pytest
import torch
import torch.distributed as dist

from ut.models.rank_threads import run_ranks


def _sum_of_ranks(rank):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), float(t)


def _rank_one_fails(rank):
    if rank == 1:
        raise ValueError("bad shard")
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 waits here until rank 1's error wakes it
    return float(t)


def test_each_thread_is_its_rank_and_collectives_are_real():
    assert run_ranks(3, _sum_of_ranks) == [(0, 3, 6.0), (1, 3, 6.0), (2, 3, 6.0)]


def test_a_failing_rank_is_named_and_the_next_world_runs():
    with pytest.raises(RuntimeError, match=r"^rank 1 of 2 failed: ValueError\('bad shard'\)"):
        run_ranks(2, _rank_one_fails, timeout=120)
    assert run_ranks(2, _sum_of_ranks) == [(0, 2, 3.0), (1, 2, 3.0)]


def _rank_zero_skips_the_collective(rank):
    if rank == 1:
        dist.all_reduce(torch.ones(1))  # rank 0 never joins it
    return rank


def test_ranks_waiting_on_each_other_time_out_and_the_next_world_runs():
    with pytest.raises(TimeoutError, match=r"^ranks \[1\] of 2 still running after 2 s$"):
        run_ranks(2, _rank_zero_skips_the_collective, timeout=2)
    assert run_ranks(2, _sum_of_ranks) == [(0, 2, 3.0), (1, 2, 3.0)]
