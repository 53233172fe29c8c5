"""Pick the compute device and the matching torch.distributed backend."""
import torch


def _npu_count() -> int:
    # torch_npu is optional; any import or runtime failure means "no NPU"
    try:
        import torch_npu  # noqa: F401
        if torch.npu.is_available():
            return torch.npu.device_count()
    except Exception:
        pass
    return 0


def get_device(local_rank: int = 0) -> torch.device:
    """Return npu > cuda > cpu; accelerators are indexed by local_rank modulo their count."""
    n_npu = _npu_count()
    if n_npu > 0:
        return torch.device("npu", local_rank % n_npu)
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


_BACKENDS = {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}


def get_dist_backend(device: torch.device, requested: str = None) -> str:
    """Collective backend for a device: ``requested`` (megatron_training.distributed_backend)
    when the device can run it - gloo runs anywhere -, else the device's own:
    hccl (npu), nccl (cuda), gloo (cpu)."""
    # a plain string such as "npu:0" is accepted too, since torch.device("npu") needs torch_npu
    kind = device.type if isinstance(device, torch.device) else str(device).split(":")[0]
    if kind not in _BACKENDS:
        raise ValueError(f"no distributed backend known for device type {kind!r}")
    if requested in ("gloo", _BACKENDS[kind]):
        return requested
    return _BACKENDS[kind]
