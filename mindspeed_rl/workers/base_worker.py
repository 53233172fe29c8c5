"""Worker base: process-group set-up and the dock data path shared by all workers."""
import os
import socket
import time
from datetime import timedelta
from typing import Dict, Iterator, List, Optional, Tuple

import ray
import torch
import torch.distributed as dist
from transformers.utils import logging as hf_logging

from mindspeed_rl.models.device import get_device, get_dist_backend
from mindspeed_rl.trainer.utils.columnar import ColumnBatch
from mindspeed_rl.utils.dist_sync import broadcast_object
from mindspeed_rl.workers.parallel_state import ParallelState

_TIMED_OUT = (None, None, None)


class BaseWorker:
    """One rank of a worker group (a Ray actor). The TP source rank of each
    tensor-parallel group talks to the transfer dock and broadcasts to its peers.
    The layout, dispatch sizes and timeouts come from ``run_plan`` only."""

    def __init__(self, megatron_config, rl_config, generate_config, rank: int, world_size: int,
                 run_plan=None, **kwargs):
        if run_plan is None:
            raise ValueError("BaseWorker needs the run_plan (config_cls.RunPlan) of the run")
        if world_size != run_plan.layout.world_size:
            raise ValueError(f"world_size {world_size} disagrees with the run plan's {run_plan.layout.world_size}")
        self.megatron_config = megatron_config
        self.rl_config = rl_config
        self.generate_config = generate_config
        self.run_plan = run_plan
        self.rank, self.world_size = rank, world_size
        self.kwargs = kwargs
        self.td = None
        self.parallel_state: Optional[ParallelState] = None
        self.device = get_device(int(os.environ.get("LOCAL_RANK", 0)))
        hf_logging.disable_progress_bar()
        if self.device.type == "cpu":
            torch.set_num_threads(max(1, int(os.environ.get("MSRL_THREADS_PER_WORKER", 1))))

    # ------------------------------------------------------------ set-up

    @staticmethod
    def get_master_addr_port() -> Tuple[str, int]:
        """Address and a free port on this node for the process-group rendezvous."""
        addr = "127.0.0.1" if not os.environ.get("RAY_ADDRESS") else ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind((addr, 0))
            return addr, sock.getsockname()[1]

    def init_distributed(self, master_addr: str, master_port: int):
        backend = get_dist_backend(self.device, self.megatron_config.distributed_backend)
        dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}",
                                rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=self.run_plan.timeouts.collective))
        self.parallel_state = ParallelState.from_layout(self.rank, self.run_plan.layout).build_groups()
        if self.run_plan.layout.engine != "ddp":
            self.parallel_state.build_mesh(self.device.type)
        return self.rank

    def init_transfer_dock(self, td):
        self.td = td

    def shutdown(self):
        self.td = None  # drop the dock handle now, not while the process is being killed
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------ dock data path

    @property
    def is_tp_src(self) -> bool:
        return self.parallel_state.tp_rank == 0

    def _fetch_share(self, stage: str, columns: List[str], deadline: float):
        """On the TP source: (batch, indexes, done) from the dock, or _TIMED_OUT
        once ``deadline`` passed with nothing ready; broadcast to the TP group
        so its ranks always take the same branch."""
        payload = None
        if self.is_tp_src:
            payload = ray.get(self.td.get_rank_share.remote(stage, columns, self.parallel_state.dp_rank))
            if payload[0] is None and not payload[2] and time.monotonic() > deadline:
                payload = _TIMED_OUT
        return broadcast_object(payload, self.parallel_state.tp_src, self.parallel_state.tp_group)

    def collect_transfer_dock_data(self, output: Dict[str, List[torch.Tensor]], index: List[int],
                                   use_vllm: bool = False):
        """Write results back (the TP source only; its peers hold the same values)."""
        if self.is_tp_src:
            output = ColumnBatch({k: [t.detach().cpu() for t in v] for k, v in output.items()})
            ray.get(self.td.put_experience.remote(data_dict=output, indexes=index))

    def iterate_stage(self, stage: str, columns: List[str]) -> Iterator[Tuple[dict, List[int]]]:
        """This DP rank's shares of ``stage`` in the run plan, in order; waits
        at most ``timeouts.data_wait`` seconds for each."""
        wait = self.run_plan.timeouts.data_wait
        while True:
            deadline = time.monotonic() + wait
            batch, index, done = self._fetch_share(stage, columns, deadline)
            while batch is None and done is False:
                time.sleep(0.01)
                batch, index, done = self._fetch_share(stage, columns, deadline)
            if done is None:
                raise TimeoutError(f"rank {self.rank}: consumer '{stage}' got no data for columns {columns} "
                                   f"within td_timeout={wait:g}s")
            if done:
                return
            yield batch, index
