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
from mindspeed_rl.utils.dist_sync import broadcast_object
from mindspeed_rl.workers.parallel_state import ParallelState

_DONE = "__all_consumed__"
_TIMEOUT = "__timed_out__"


class BaseWorker:
    """One rank of a worker group (a Ray actor). The TP source rank of each
    tensor-parallel group talks to the transfer dock and broadcasts to its peers."""

    def __init__(self, megatron_config, rl_config, generate_config, rank: int, world_size: int, **kwargs):
        self.megatron_config = megatron_config
        self.rl_config = rl_config
        self.generate_config = generate_config
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
        dist.init_process_group(get_dist_backend(self.device), init_method=f"tcp://{master_addr}:{master_port}",
                                rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=self.rl_config.td_timeout + 60))
        tp = self.megatron_config.tensor_model_parallel_size
        self.parallel_state = ParallelState(self.rank, self.world_size, tp).build_groups()
        return self.rank

    def init_transfer_dock(self, td):
        self.td = td

    def shutdown(self):
        if dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------ dock data path

    @property
    def is_tp_src(self) -> bool:
        return self.parallel_state.tp_rank == 0

    def _fetch(self, stage, columns, count, indexes, get_n_samples, stop_when_consumed, deadline=None):
        """On the TP source: the dock's answer, _DONE, or _TIMEOUT once
        ``deadline`` passed with nothing ready; broadcast to the TP group so
        its ranks always take the same branch."""
        payload = None
        if self.is_tp_src:
            if stop_when_consumed and ray.get(self.td.all_consumed.remote(stage)):
                payload = _DONE
            else:
                batch, index = ray.get(self.td.get_experience.remote(
                    stage, columns, count, indexes=indexes, get_n_samples=get_n_samples,
                    use_batch_seqlen_balance=self.rl_config.use_dp_batch_balance))
                payload = (batch, index) if index else None
            if payload is None and deadline is not None and time.monotonic() > deadline:
                payload = _TIMEOUT
        return broadcast_object(payload, self.parallel_state.tp_src, self.parallel_state.tp_group)

    def dispatch_transfer_dock_data(self, experience_consumer_stage: str, experience_columns: List[str],
                                    experience_count: int, tp_size: int = 1, cp_size: int = 1, cp_algo=None,
                                    use_vllm: bool = False, indexes: Optional[List[int]] = None,
                                    get_n_samples: bool = True):
        """One request to the dock for this TP group: ``(batch, indexes)`` or
        ``(None, None)`` when nothing is ready."""
        payload = self._fetch(experience_consumer_stage, experience_columns, experience_count, indexes,
                              get_n_samples, stop_when_consumed=False)
        return payload if payload is not None else (None, None)

    def collect_transfer_dock_data(self, output: Dict[str, List[torch.Tensor]], index: List[int],
                                   use_vllm: bool = False):
        """Write results back (the TP source only; its peers hold the same values)."""
        if self.is_tp_src:
            output = {k: [t.detach().cpu() for t in v] for k, v in output.items()}
            ray.get(self.td.put_experience.remote(data_dict=output, indexes=index))

    def iterate_stage(self, stage: str, columns: List[str], count: int, get_n_samples: bool = True,
                      max_batches: Optional[int] = None) -> Iterator[Tuple[dict, List[int]]]:
        """Batches of ``stage`` until the dock has served all rows or this TP
        group took ``max_batches``; waits at most ``td_timeout`` seconds for data."""
        served = 0
        while max_batches is None or served < max_batches:
            deadline = time.monotonic() + self.rl_config.td_timeout
            payload = None
            while payload is None:
                payload = self._fetch(stage, columns, count, None, get_n_samples, True, deadline)
                if payload is None:
                    time.sleep(0.01)
            if payload == _DONE:
                return
            if payload == _TIMEOUT:
                raise TimeoutError(f"rank {self.rank}: consumer '{stage}' got no data for columns {columns} "
                                   f"within td_timeout={self.rl_config.td_timeout:g}s")
            served += 1
            yield payload
