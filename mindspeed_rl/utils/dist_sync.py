"""Collective helpers shared by workers (kept out of the pure balancer)."""

import torch
import torch.distributed as dist

_OPS = {"max": dist.ReduceOp.MAX, "sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN}


def group_device(group=None) -> torch.device:
    """The device a collective on ``group`` must use: CPU for gloo, else the
    current accelerator (npu or cuda) of this process."""
    if dist.get_backend(group) == "gloo":
        return torch.device("cpu")
    if hasattr(torch, "npu") and torch.npu.is_available():
        return torch.device("npu", torch.npu.current_device())
    return torch.device("cuda", torch.cuda.current_device())


def _active(group) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def all_reduce_scalar(value: float, op: str = "sum", group=None) -> float:
    """``value`` reduced over ``group`` (op: sum, max or min); local value
    when no process group is running."""
    if not _active(group):
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=group_device(group))
    dist.all_reduce(tensor, op=_OPS[op], group=group)
    return tensor.item()


def sync_micro_batch_count(count: int, group=None) -> int:
    """Largest micro-batch count over ``group`` (all_reduce MAX), so that every
    data-parallel rank runs the same number of forward/backward passes."""
    return int(all_reduce_scalar(int(count), "max", group))
