"""Worker base: process-group set-up and the stage call shared by all workers."""
import os
import socket
import time
from datetime import timedelta
from typing import Dict, List, Optional, Tuple

import ray
import torch
import torch.distributed as dist
from transformers.utils import logging as hf_logging

from mindspeed_rl.workers.upstream_io import UpstreamWorkerIO
from mindspeed_rl.config_cls.base_config import BaseConfig
from mindspeed_rl.models.device import get_device, get_dist_backend
from mindspeed_rl.data.columnar import ColumnBatch, cpu_batch
from mindspeed_rl.workers.parallel_state import ParallelState
from mindspeed_rl.balance.rollout_queue import LocalSource, RolloutQueue
from mindspeed_rl.workers.rollout_source import RaySource


class BaseWorker(UpstreamWorkerIO):
    """One rank of a worker group (a Ray actor). For each stage group the
    driver sends every rank its DP rank's row ids and rows (TP peers get the
    same ones); the TP source returns the results for the dock. Everything a
    rank reads of the run comes from ``run_plan`` (layout, stages, timeouts)
    and its ``worker`` spec (engine, optimizer, sampling, micro-batches, loss);
    the config objects stay in the driver. Upstream's dock methods
    (``init_transfer_dock``, ``collect_transfer_dock_data``) come from
    ``workers.upstream_io.UpstreamWorkerIO``."""

    def __init__(self, rank: int, world_size: int, run_plan, **kwargs):
        if run_plan is None or not hasattr(run_plan, "worker"):
            raise ValueError(f"BaseWorker needs the run_plan (config_cls.RunPlan) of the run, "
                             f"got {type(run_plan).__name__}")
        configs = sorted(k for k, v in kwargs.items() if isinstance(v, BaseConfig))
        if configs:  # what a worker reads travels in run_plan.worker
            raise TypeError(f"BaseWorker takes no config objects (got {configs}); put what the worker "
                            f"reads in the run plan's worker spec (plan.worker_spec)")
        if world_size != run_plan.layout.world_size:
            raise ValueError(f"world_size {world_size} disagrees with the run plan's {run_plan.layout.world_size}")
        self.run_plan = run_plan
        self.rank, self.world_size = rank, world_size
        self.parallel_state: Optional[ParallelState] = None
        self._rendezvous: Optional[socket.socket] = None  # rank 0's listening socket of the rendezvous store
        self.device = get_device(int(os.environ.get("LOCAL_RANK", 0)))
        hf_logging.disable_progress_bar()
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, int(os.environ.get("MSRL_THREADS_PER_WORKER", 1))))

    # ------------------------------------------------------------ set-up

    def get_master_addr_port(self) -> Tuple[str, int]:
        """Address and port of the process-group rendezvous, served by this rank (rank 0): in a Ray worker its
        node's address (what the other nodes reach it by; 127.0.0.1 on a local Ray), else 127.0.0.1. The socket
        is bound to that address only and kept listening for ``init_distributed``'s store: the port cannot be
        taken in between, and nothing listens on the node's other interfaces."""
        addr = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        self._rendezvous = socket.create_server((addr, 0), backlog=max(128, self.world_size))
        return addr, self._rendezvous.getsockname()[1]

    def init_distributed(self, master_addr: str, master_port: int):
        backend = get_dist_backend(self.device, self.run_plan.worker.engine.distributed_backend)
        timeout = timedelta(seconds=self.run_plan.timeouts.collective)
        if self.rank == 0 and self._rendezvous is None:  # an address given without get_master_addr_port
            self._rendezvous = socket.create_server((master_addr, master_port), backlog=max(128, self.world_size))
        # rank 0 serves the store on its socket (bound to the rendezvous address alone), the others connect
        store = dist.TCPStore(master_addr, master_port, self.world_size, self.rank == 0, timeout=timeout,
                              master_listen_fd=self._rendezvous.fileno() if self.rank == 0 else None)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout)
        self.parallel_state = ParallelState.from_layout(self.rank, self.run_plan.layout).build_groups()
        if self.run_plan.layout.engine != "ddp":
            self.parallel_state.build_mesh(self.device.type)
        return self.rank

    def pin_cores(self, cores: List[int]) -> List[int]:
        """Run this rank on ``cores`` alone (benchmarks: a core per rank, as a device per rank); returns them."""
        from mindspeed_rl.workers.scheduler.pinning import pin_process
        return pin_process(cores)

    def shutdown(self):
        super().shutdown()  # upstream's dock handle, dropped now, not while the process is being killed
        if dist.is_initialized():
            dist.destroy_process_group()
        listening = getattr(self, "_rendezvous", None)  # a rank made without __init__ (upstream's dock path) has none
        if listening is not None:
            listening.close()
            self._rendezvous = None

    # ------------------------------------------------------------ stages

    @property
    def is_tp_src(self) -> bool:
        return self.parallel_state.tp_rank == 0

    def run_stage(self, group, plan: List[List[List[int]]], batch, **context) -> Tuple[Dict[str, float], object]:
        """Run the DP stages of ``group`` (trainer.stage_runner.StageGroup; they
        share one plan) in order on this rank's shares of the round's ``plan``
        (row lists per DP rank, from the dock's ``dispatch``); ``batch`` holds
        those rows (the shares concatenated). Returns (metrics, output columns
        for the dock's ``put_stage``; None on TP peers and for stages that write nothing)."""
        metrics, output = {}, {}
        batch = batch if isinstance(batch, ColumnBatch) else ColumnBatch(batch)
        for name in group.names:
            stage_metrics, stage_output = self._run_one(name, plan, batch, context)
            metrics.update(stage_metrics)
            output.update(stage_output or {})
        if not output or not self.is_tp_src:
            return metrics, None
        return metrics, cpu_batch(output)

    def rollout_consumer(self) -> Tuple[int, bool]:
        """(this rank's consumer id on the rollout queue, whether it returns the rows it makes): every rank
        when each holds a whole engine (``RunPlan.rollout_consumers`` = world size), else one consumer per
        TP group (a TP-sharded model generates together; its TP source returns the rows)."""
        if self.run_plan.rollout_consumers == self.world_size:
            return self.rank, True
        return self.parallel_state.dp_rank, self.is_tp_src

    def run_queued_stage(self, group, order: List[int], batch, queue, key, firsts=None, **context):
        """Run the queued stage of ``group`` (one stage) on the rows this rank takes from ``queue`` (round
        ``key``; the RolloutQueue actor, or a RolloutQueue in this process): ``order`` is the round's row ids in
        queue order, ``batch`` their inputs in that order; ``firsts``: each consumer's first take, answered when
        the queue was loaded.
        Returns (metrics, output columns, trace) with the row ids and the takes that brought rows in the trace;
        a mirroring TP peer returns (metrics, None, None)."""
        if len(group.names) != 1:
            raise ValueError(f"rank {self.rank}: a queued stage runs alone, got {list(group.names)}")
        stage = self.run_plan.stages.get(group.names[0])
        if stage is None or not stage.queued:
            raise ValueError(f"rank {self.rank}: the run plan has no queued stage '{group.names[0]}'")
        consumer, returns = self.rollout_consumer()
        inputs = {c: batch[c] for c in stage.inputs}
        first = (firsts or {}).get(consumer)
        if isinstance(queue, RolloutQueue):  # a queue in this process (tests, a single-process driver)
            source = LocalSource(queue, consumer, order, inputs, first=first)
        else:  # the launcher's queue actor
            source = RaySource(queue, key, consumer, order, inputs,
                               deadline=time.monotonic() + self.run_plan.timeouts.stage_deadline, first=first)
        metrics, output, trace = getattr(self, stage.stage.queue_method)(source, **context)
        if not returns:
            return metrics, None, None
        trace["consumer"], trace["takes"] = consumer, source.takes
        return metrics, cpu_batch(output), trace

    def _run_one(self, name: str, plan, batch, context):
        stage = self.run_plan.stages.get(name)
        if stage is None or not stage.is_dp:
            raise ValueError(f"rank {self.rank}: the run plan has no DP stage '{name}'")
        stage.check_plan(plan, self.parallel_state.dp_size, f"rank {self.rank}")
        shares = plan[self.parallel_state.dp_rank]
        batches, start = [], 0
        for share in shares:  # each share's rows as views of the received buffers
            batches.append(batch.take(start, start + len(share), stage.inputs))
            start += len(share)
        return getattr(self, stage.method)(batches, shares, **context)
