"""Collective helpers shared by workers (kept out of the pure balancer)."""
import torch
import torch.distributed as dist


def group_device(group=None) -> torch.device:
    """The device a collective on ``group`` must use: CPU for gloo, else the
    current accelerator (npu or cuda) of this process."""
    backend = dist.get_backend(group)
    if backend == "gloo":
        return torch.device("cpu")
    if hasattr(torch, "npu") and torch.npu.is_available():
        return torch.device("npu", torch.npu.current_device())
    return torch.device("cuda", torch.cuda.current_device())


def sync_micro_batch_count(count: int, group=None) -> int:
    """Largest micro-batch count over ``group`` (all_reduce MAX), so that every
    data-parallel rank runs the same number of forward/backward passes."""
    if not dist.is_available() or not dist.is_initialized():
        return int(count)
    value = torch.tensor([int(count)], dtype=torch.int64, device=group_device(group))
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return int(value.item())
