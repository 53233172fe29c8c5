"""Run the ranks of a small process group as threads of the test process.

torch's threaded process group (its own distributed test harness) gives each
thread a rank with real collectives between the threads, so DTensor TP, FSDP2
and the engine run in-process: a test sees every call (coverage, mutation
testing's test mapping) and needs no spawn. The gloo process tests keep one
layout each to check the same code across real processes.
"""
import threading
import time

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.multi_threaded_pg import (ProcessLocalGroup, _install_threaded_pg,
                                                                     _uninstall_threaded_pg)

_LOCK = threading.Lock()  # one threaded world at a time in this process
_LOAD = threading.Lock()


class SerialLoads:
    """Stands in for ``AutoModelForCausalLM`` where ranks are threads: transformers builds a model
    under process-wide meta-device hooks, so two threads loading at once corrupt each other's model;
    loads run one at a time (no collective happens while loading)."""

    def __init__(self, auto_cls):
        self.auto_cls = auto_cls

    def from_pretrained(self, *args, **kwargs):
        with _LOAD:
            return self.auto_cls.from_pretrained(*args, **kwargs)


def serial_loads():
    """Held while a rank thread builds a model itself (meta-device models too), for the same reason."""
    return _LOAD


def run_ranks(world: int, fn, *args, timeout: float = 180.0):
    """``fn(rank, *args)`` on ``world`` threads, one rank each; returns the results by rank.
    A rank that raises wakes the others and its error is raised here, naming the rank. Ranks
    still running ``timeout`` seconds after the start (waiting on each other: a collective that
    not every rank joins) are woken and TimeoutError is raised."""
    with _LOCK:
        _install_threaded_pg()
        ProcessLocalGroup.reset()  # a failed world before this one leaves its termination flag set
        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        store = dist.HashStore()
        results, errors = [None] * world, []  # errors in the order they happened

        def body(rank):
            dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
            try:
                results[rank] = fn(rank, *args)
            except BaseException as exc:  # noqa: BLE001 - reported below with its rank
                errors.append((rank, exc))
                ProcessLocalGroup.exception_handle(exc)  # wakes ranks blocked in a collective
            finally:
                dist.destroy_process_group()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
        deadline = time.monotonic() + timeout
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            stuck = [r for r, t in enumerate(threads) if t.is_alive()]
            if stuck:
                ProcessLocalGroup.exception_handle(TimeoutError())  # they leave their collectives
                for t in threads:
                    t.join(10.0)
        finally:
            torch._C._distributed_c10d._set_thread_isolation_mode(False)
            _uninstall_threaded_pg()
        if stuck:
            raise TimeoutError(f"ranks {stuck} of {world} still running after {timeout:.0f} s")
        if errors:
            rank, exc = errors[0]  # the first: the others may only have been woken by it
            raise RuntimeError(f"rank {rank} of {world} failed: {exc!r}") from exc
        return results
