"""Placements for benchmarks: pinned (a core of its own per rank, as a device per rank) or shared (every core per
rank: an idle rank lends its cores); pin_process is what a worker rank's pin_cores runs."""
import pytest

from mindspeed_rl.workers.base_worker import BaseWorker
from mindspeed_rl.workers.scheduler import pinning


def test_pinned_gives_each_rank_a_core_of_its_own_and_shared_gives_every_core():
    assert pinning.placement_cores("pinned", 2, [5, 3, 9]) == [[3], [5]]
    assert pinning.placement_cores("shared", 2, [5, 3]) == [[3, 5], [3, 5]]
    with pytest.raises(ValueError, match=r"^MSRL_PIN_CORES=1: 3 ranks need as many cores; this machine lets the "
                                         r"run use 2$"):
        pinning.placement_cores("pinned", 3, [0, 1])
    assert pinning.placement_cores("shared", 3, [0, 1]) == [[0, 1]] * 3  # sharing needs no core per rank
    with pytest.raises(ValueError, match="^placement must be 'pinned' or 'shared', got 'half'$"):
        pinning.placement_cores("half", 2, [0, 1])


@pytest.mark.parametrize("cores", [[3], [1, 2]])
def test_pin_process_sets_the_cores_and_as_many_threads(monkeypatch, cores):
    import torch
    calls = []
    monkeypatch.setattr(pinning.os, "sched_setaffinity", lambda pid, got: calls.append(("affinity", pid, got)))
    monkeypatch.setattr(pinning.os, "sched_getaffinity", lambda pid: {9, *cores})
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(("threads", n)))
    assert pinning.pin_process(cores) == sorted({9, *cores})
    assert calls == [("affinity", 0, set(cores)), ("threads", len(cores))]
    calls.clear()
    assert BaseWorker.pin_cores(None, cores) == sorted({9, *cores})  # a worker rank pins the same way
    assert calls == [("affinity", 0, set(cores)), ("threads", len(cores))]
