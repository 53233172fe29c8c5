"""Model-state sharding with PyTorch's own engine.

Tensor parallel: DTensor over the mesh's ``tp`` dimension, per decoder layer
(attention q/k/v and MLP gate/up column-wise, o/down row-wise). FSDP2
(``fully_shard``) over the ``dp`` dimension, per decoder layer, then the
root: parameters, gradients and optimizer state sharded. ``TP_PLAN`` and
``planned_local_numel`` are also what the memory plan counts with, and a test
holds them to what the engine really allocates.
"""
import contextlib
import math
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# decoder-layer linear -> split; column-wise splits weight dim 0 (and bias), row-wise weight dim 1
TP_PLAN = {
    "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise",
}


def build_mesh(device_type: str, dp: int, tp: int) -> DeviceMesh:
    """The run's 2-D (dp, tp) mesh over the default process group (tp fastest)."""
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))


def decoder_layers(module) -> List[torch.nn.Module]:
    return list(module.model.layers)


def check_tp_divides(config, tp: int, error_cls=ValueError):
    """TP must split attention heads, KV heads and the MLP evenly."""
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name)
        if value % tp:
            raise error_cls(f"tensor_model_parallel_size={tp} does not divide the model's {name}={value}")


def apply_tensor_parallel(module, tp_mesh: DeviceMesh):
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {name: styles[kind]() for name, kind in TP_PLAN.items()}
    for layer in decoder_layers(module):
        parallelize_module(layer, tp_mesh, plan)


def apply_fsdp(module, dp_mesh: DeviceMesh, param_dtype: Optional[torch.dtype] = None):
    """FSDP2 per decoder layer, then the root; ``param_dtype`` computes in
    lower precision while reducing gradients and keeping master weights in fp32."""
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else \
        MixedPrecisionPolicy()
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
    fully_shard(module, mesh=dp_mesh, mp_policy=policy)


def fsdp_modules(module) -> List[FSDPModule]:
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def gathered(module):
    """Parameters all-gathered once for a run of forwards (log-probs, generate),
    then sharded again; no collective per forward. A no-op without FSDP."""
    mods = fsdp_modules(module)
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m in mods:
            m.reshard()
            m.set_reshard_after_forward(True, recurse=False)


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank holds for ``tensors`` (local shards of DTensors)."""
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def optimizer_state_bytes(optimizer) -> int:
    return local_bytes(v for state in optimizer.state.values() for v in state.values()
                       if torch.is_tensor(v) and v.dim() > 0)


def grad_norm(params: List[torch.nn.Parameter]) -> float:
    """Global L2 norm of the gradients, DTensor aware (each shard counted once)."""
    total = 0.0
    for p in params:
        if p.grad is None:
            continue
        norm = torch.linalg.vector_norm(p.grad.float())
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        total += float(norm) ** 2
    return math.sqrt(total)


def clip_grads(params: List[torch.nn.Parameter], max_norm: float) -> float:
    norm = grad_norm(params)
    if math.isfinite(norm) and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
    return norm


def all_reduce_grads(params: List[torch.nn.Parameter], group) -> None:
    """Average gradients over ``group`` (data parallel without FSDP, e.g. TP only)."""
    size = dist.get_world_size(group)
    for p in params:
        if p.grad is not None:
            g = local(p.grad)
            dist.all_reduce(g, group=group)
            g.div_(size)


def _chunk(n: int, parts: int, index: int) -> int:
    # size of torch.chunk(range(n), parts)[index] (FSDP2 and DTensor Shard split this way)
    size = -(-n // parts) if parts else n
    return max(0, min(size, n - size * index))


def planned_local_numel(name: str, shape: Tuple[int, ...], dp: int, tp: int, dp_rank: int = 0,
                        tp_rank: int = 0, fsdp: bool = True) -> int:
    """Elements of parameter ``name`` held by rank (dp_rank, tp_rank): the TP
    split of TP_PLAN, then FSDP's dim-0 split over dp."""
    shape = list(shape)
    kind = next((k for suffix, k in TP_PLAN.items() if name.endswith(f"{suffix}.weight")
                 or name.endswith(f"{suffix}.bias")), None)
    if kind == "colwise" and tp > 1:
        shape[0] = _chunk(shape[0], tp, tp_rank)
    elif kind == "rowwise" and tp > 1 and len(shape) == 2:
        shape[1] = _chunk(shape[1], tp, tp_rank)
    if fsdp and dp > 1 and shape:
        shape[0] = _chunk(shape[0], dp, dp_rank)
    return math.prod(shape)


def full_state_dict(module) -> Dict[str, torch.Tensor]:
    """Full (gathered) CPU state dict, complete on global rank 0 (other ranks
    get an empty dict); every rank must call it (DTensor / FSDP aware)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tied: Dict[int, List[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        tied.setdefault(id(param), []).append(name)
    for names in tied.values():  # tied weights (embedding / LM head) under every name
        kept = next((n for n in names if n in state), None)
        for name in names:
            if kept is not None and name not in state:
                state[name] = state[kept]
    return state
