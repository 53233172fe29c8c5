"""Upstream's rank-side dock path: ranks that pull rows from a GRPOTransferDock
actor (``get_experience``) and write their results back themselves (importable as mindspeed_rl.compat.workers).

``BaseWorker`` and ``RayActorGroup`` take these methods from the two classes
below; our own stages never use them (the driver sends each rank its rows and
writes the results, trainer/stage_runner.py)."""
from typing import Dict, List

import ray
import torch

from mindspeed_rl.data.columnar import cpu_batch


class UpstreamWorkerIO:
    """A rank's handle on upstream's dock actor (``self.td``) and its writes to it."""

    td = None

    def init_transfer_dock(self, td):
        self.td = td

    def write_rows(self, output: Dict[str, List[torch.Tensor]], rows: List[int]):
        """Write results to the dock in one call (the TP source only; its peers hold the same values)."""
        if self.is_tp_src and rows:
            ray.get(self.td.put_experience.remote(data_dict=cpu_batch(output), indexes=list(rows)))

    def collect_transfer_dock_data(self, output: Dict[str, List[torch.Tensor]], index: List[int],
                                   use_vllm: bool = False):
        """Upstream's name for writing results to the dock."""
        self.write_rows(output, index)

    def shutdown(self):
        self.td = None


class UpstreamGroupIO:
    """A worker group hands its ranks upstream's dock actor."""

    def sync_init_transfer_dock(self, transfer_dock, mm_transfer_dock=None):
        """Give every rank an upstream-style dock actor for the pull API (``get_experience``)."""
        if not isinstance(transfer_dock, ray.actor.ActorHandle):
            raise TypeError(f"sync_init_transfer_dock: ranks take a GRPOTransferDock actor handle, got "
                            f"{type(transfer_dock).__name__} (a DriverDock stays in the driver; the trainer "
                            f"sends each rank its rows)")
        self.execute_sync_command("init_transfer_dock", transfer_dock)
