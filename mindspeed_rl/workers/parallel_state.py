"""Rank layout of a worker group: ranks = DP x TP (tensor-parallel fastest).

Tensor-parallel peers hold the same data (the driver sends each of them its DP
rank's rows, one shared object); data-parallel peers hold different shares and
sync gradients. The sharded engines also use the (dp, tp) DeviceMesh built here.
"""
from dataclasses import dataclass, field
from typing import List

import torch.distributed as dist


@dataclass
class ParallelState:
    rank: int
    world_size: int
    tp_size: int = 1
    tp_group: object = field(default=None, repr=False)
    dp_group: object = field(default=None, repr=False)
    mesh: object = field(default=None, repr=False)  # (dp, tp) DeviceMesh for the sharded engines

    def __post_init__(self):
        if self.tp_size <= 0 or self.world_size % self.tp_size:
            raise ValueError(f"world size {self.world_size} is not divisible by tensor_model_parallel_size {self.tp_size}")

    @classmethod
    def from_layout(cls, rank: int, layout) -> "ParallelState":
        """From the run plan's layout (the one place the layout is derived)."""
        return cls(rank, layout.world_size, layout.tp)

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def tp_src(self) -> int:
        """Global rank that talks to the dock for this TP group."""
        return self.rank - self.tp_rank

    def tp_ranks(self, dp_rank: int) -> List[int]:
        return [dp_rank * self.tp_size + t for t in range(self.tp_size)]

    def dp_ranks(self, tp_rank: int) -> List[int]:
        return [d * self.tp_size + tp_rank for d in range(self.dp_size)]

    def build_mesh(self, device_type: str):
        """The (dp, tp) DeviceMesh of this layout (all ranks call this together)."""
        from mindspeed_rl.models.sharding import build_mesh
        self.mesh = build_mesh(device_type, self.dp_size, self.tp_size)
        return self

    def build_groups(self):
        """Create every TP and DP group (all ranks must call this together)."""
        for d in range(self.dp_size):
            group = dist.new_group(self.tp_ranks(d))
            if d == self.dp_rank:
                self.tp_group = group
        for t in range(self.tp_size):
            group = dist.new_group(self.dp_ranks(t))
            if t == self.tp_rank:
                self.dp_group = group
        return self
