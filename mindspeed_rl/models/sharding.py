"""Model-state parallelism with PyTorch's own engine, one entry point for every layout.

``parallelize(module, mesh, spec)`` applies, as torchtitan does:
tensor parallel with DTensor over the mesh's ``tp`` dimension, from the HF
model config's own ``base_model_tp_plan`` (``TP_PLAN`` below only where a
model has none); then, over ``dp``, FSDP2 (``fully_shard`` per decoder layer
and the root: parameters, gradients and optimizer state sharded) or
``replicate`` (DDP semantics). ``tp_plan`` and ``planned_local_numel`` are
also what the memory plan counts with, and a test holds them to what the
engine really allocates.

A style of the HF plan that this engine does not apply never stops a run: the
module stays replicated over tp (FSDP still shards it over dp) and
``replicated_over_tp`` names it with the reason. MoE expert styles leave the
expert module whole; any other unapplied style inside a decoder-layer block
(``self_attn``, ``mlp``) keeps that whole block replicated, since a TP plan
splits a block as one unit (replicated in, replicated out).
"""
import contextlib
import fnmatch
import math
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# fallback plan, relative to a decoder layer: column-wise splits weight dim 0 (and bias), row-wise weight dim 1
TP_PLAN = {
    "self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise", "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise", "mlp.down_proj": "rowwise",
}
# HF plan style -> ours: colwise / rowwise split an nn.Linear's output / input features (the _rep
# variants take or give whole activations); grad_sum keeps the weight whole on every tp rank and sums
# its gradient over tp (it sees only the local heads, e.g. Qwen3's q_norm); mla_kv_a keeps MLA's
# kv_a_proj_with_mqa whole and sums over tp the gradient of its rope part (k_rot reaches only the
# local heads; the rest of its output goes through the colwise kv_b_proj, whose input grad is summed)
HF_STYLES = {"colwise": "colwise", "colwise_rep": "colwise_rep", "rowwise": "rowwise",
             "rowwise_rep": "rowwise_rep", "replicated_with_grad_allreduce": "grad_sum",
             "mla_kv_a_proj": "mla_kv_a"}
LINEAR_KINDS = ("colwise", "colwise_rep", "rowwise", "rowwise_rep", "mla_kv_a")
WHOLE_KINDS = ("grad_sum", "mla_kv_a")  # applied, but the weight stays whole on every tp rank
# HF styles for a whole MoE expert module (replicated in, replicated out): left whole, with all it holds
HF_EXPERT_STYLES = ("moe_tp_experts", "gather")


class ReplicatedOverTP(NamedTuple):
    """A (pattern, style) of the model's HF TP plan that runs replicated over tp, and why."""
    pattern: str
    style: str
    reason: str


@dataclass(frozen=True)
class ParallelSpec:
    """How ``parallelize`` lays a model over a (dp, tp) mesh."""
    fsdp: bool = False                          # shard over dp (FSDP2); False: replicate over dp
    param_dtype: Optional[torch.dtype] = None   # compute dtype under FSDP (e.g. bf16), None: as stored
    reduce_dtype: torch.dtype = torch.float32   # gradient reduction dtype


def build_mesh(device_type: str, dp: int, tp: int) -> DeviceMesh:
    """The run's 2-D (dp, tp) mesh over the default process group (tp fastest)."""
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))


def mesh_from_group(group, device_type: str) -> DeviceMesh:
    """A 1-D ``dp`` mesh over an existing process group (the DDP engine's data-parallel group)."""
    return DeviceMesh.from_group(group, device_type, mesh_dim_names=("dp",))


def mesh_dim(mesh: Optional[DeviceMesh], name: str) -> Optional[DeviceMesh]:
    """The ``name`` sub-mesh when the mesh has that dimension with more than one rank, else None."""
    if mesh is None or name not in (mesh.mesh_dim_names or ()):
        return None
    sub = mesh[name] if mesh.ndim > 1 else mesh
    return sub if sub.size() > 1 else None


def decoder_layers(module) -> List[torch.nn.Module]:
    return list(module.model.layers)


def _family(config) -> str:
    name = type(config).__name__
    return name[:-len("Config")] if name.endswith("Config") else name


def _match(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) and name.count(".") == pattern.count(".")


def _block(name: str) -> str:
    # the decoder-layer child a name lies in (layers.<i>.<child>), which a TP plan splits as one unit
    return ".".join(name.split(".")[:3])


def _resolve(module_or_config) -> Tuple[Dict[str, str], List[ReplicatedOverTP]]:
    """(module name -> our kind for what is split, what of the HF plan runs replicated over tp).
    Given a config only, each pattern stands for its modules (linear styles assumed on nn.Linear)."""
    has_modules = hasattr(module_or_config, "named_modules")
    config = module_or_config.config if has_modules else module_or_config
    hf = dict(getattr(config, "base_model_tp_plan", None) or {})
    if has_modules:
        base = module_or_config.model
        modules = dict(base.named_modules())
        params = {n for n, _ in base.named_parameters()}
        # (name, pattern, style, target): target None for a parameter
        targets = [(n, k, v, modules[n]) for k, v in hf.items() for n in modules if n and _match(n, k)]
        targets += [(n, k, v, None) for k, v in hf.items() for n in params if _match(n, k)]
    else:
        targets = [(k, k, v, torch.nn.Linear) for k, v in hf.items()]
    whole = {n: k for n, k, v, _ in targets if v in HF_EXPERT_STYLES}  # name -> its pattern
    plan: Dict[str, Tuple[str, str, str]] = {}  # name -> (kind, pattern, style)
    why: Dict[Tuple[str, str], str] = {}
    stuck: Dict[str, Tuple[str, str]] = {}  # block -> (pattern, style) of an unapplied module inside it
    seen = set()
    for name, pattern, style, target in targets:
        if name in seen:
            continue  # the first pattern that names a module decides
        seen.add(name)
        kind = HF_STYLES.get(style)
        inside = next((k for w, k in whole.items() if name.startswith(w + ".")), None)
        is_linear = target is torch.nn.Linear or isinstance(target, torch.nn.Linear)
        if not name.startswith("layers."):
            reason = "is not applied: this engine splits decoder layers only"
        elif style in HF_EXPERT_STYLES:
            reason = "is not applied by this engine: the MoE experts stay whole (FSDP shards them over dp)"
        elif inside is not None:
            reason = f"is not applied: it lies inside {inside}, which stays whole"
        elif kind is None:
            reason = "is not applied by this engine"
        elif target is None:
            reason = "is not applied: it names a parameter, not a module"
        elif kind in LINEAR_KINDS and not is_linear:
            reason = f"is not applied: {type(target).__name__} is not an nn.Linear"
        elif kind == "mla_kv_a" and getattr(config, "qk_rope_head_dim", None) is None:
            reason = "is not applied: the config has no qk_rope_head_dim"
        else:
            plan[name] = (kind, pattern, style)
            continue
        why.setdefault((pattern, style), reason)
        if name.startswith("layers.") and style not in HF_EXPERT_STYLES and inside is None:
            stuck.setdefault(_block(name), (pattern, style))
    for name in [n for n in plan if _block(n) in stuck]:
        _, pattern, style = plan.pop(name)
        other, other_style = stuck[_block(name)]
        why.setdefault((pattern, style), f"is not applied: {other} in the same block has style "
                                         f"{other_style!r}, which is not applied, so the block stays whole")
    kinds = {(f"model.{n}" if has_modules else n): k for n, (k, _, _) in plan.items()}
    return kinds, [ReplicatedOverTP(p, s, r) for (p, s), r in why.items()]


def replicated_over_tp(module_or_config) -> List[ReplicatedOverTP]:
    """What of the model's HF ``base_model_tp_plan`` runs replicated over tp, one entry per
    (pattern, style), with the reason. Never raises on a style it does not know. A causal LM
    (meta-device is fine) gives what the engine really does; a config gives it by pattern."""
    return _resolve(module_or_config)[1]


def replicated_lines(module_or_config) -> List[str]:
    """One line per ``replicated_over_tp`` entry, naming the model family, the module and why."""
    config = getattr(module_or_config, "config", module_or_config)
    return [f"tensor parallel: {_family(config)} {r.pattern} style {r.style!r} {r.reason}; "
            f"the module stays replicated over tp" for r in replicated_over_tp(module_or_config)]


def splits_attention(module_or_config) -> bool:
    """Whether tensor parallel splits the attention heads (a config: by its HF plan's patterns)."""
    config = getattr(module_or_config, "config", module_or_config)
    if not getattr(config, "base_model_tp_plan", None):
        return True  # TP_PLAN splits q/k/v/o
    plan = _resolve(module_or_config)[0]
    return any(".self_attn." in n and k not in WHOLE_KINDS for n, k in plan.items())


def tp_plan(module) -> Dict[str, str]:
    """Module name (from the causal LM root) -> 'colwise' | 'colwise_rep' | 'rowwise' | 'rowwise_rep' |
    'grad_sum' | 'mla_kv_a', for every decoder-layer module tensor parallel touches; from the config's
    ``base_model_tp_plan`` (HF names relative to the base model), else TP_PLAN. What the HF plan gives
    that is not here stays replicated over tp (``replicated_over_tp``). Works on a meta-device model."""
    if getattr(module.config, "base_model_tp_plan", None):
        return _resolve(module)[0]
    out: Dict[str, str] = {}
    for i, layer in enumerate(module.model.layers):
        for name, sub in layer.named_modules():
            if name in TP_PLAN and isinstance(sub, torch.nn.Linear):
                out[f"model.layers.{i}.{name}"] = TP_PLAN[name]
    return out


def check_tp_divides(module_or_config, tp: int, error_cls=ValueError, plan: Optional[Dict[str, str]] = None):
    """TP must split whole heads and every split linear evenly. Given a config only, the
    attention heads and MLP width are checked (the fallback plan's needs)."""
    if tp <= 1:
        return
    config = getattr(module_or_config, "config", module_or_config)
    if plan is None and hasattr(module_or_config, "model"):
        plan = tp_plan(module_or_config)
    splits_attention = plan is None or any(".self_attn." in n and k not in WHOLE_KINDS for n, k in plan.items())
    names = ("num_attention_heads", "num_key_value_heads") if splits_attention else ()
    if plan is None:
        names += ("intermediate_size",)
    for name in names:
        value = getattr(config, name, None)
        if value is not None and value % tp:
            raise error_cls(f"tensor_model_parallel_size={tp} does not divide the model's {name}={value}")
    if plan is None:
        return
    modules = dict(module_or_config.named_modules())
    for name, kind in plan.items():
        sub = modules[name]
        if kind in WHOLE_KINDS:
            continue
        dim, size = ("out_features", sub.out_features) if kind.startswith("colwise") else \
            ("in_features", sub.in_features)
        if size % tp:
            raise error_cls(f"tensor_model_parallel_size={tp} does not divide {name}.{dim}={size}")


def _tp_style(kind: str):
    if kind == "colwise":
        return ColwiseParallel()
    if kind == "colwise_rep":
        return ColwiseParallel(output_layouts=Replicate())
    if kind == "rowwise_rep":
        return RowwiseParallel(input_layouts=Replicate())
    return RowwiseParallel()


class _SumGradOverTP(torch.autograd.Function):
    """Identity forward; backward sums the gradient over the tp group (in fp32)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        total = grad.to(torch.float32, copy=True).contiguous()
        dist.all_reduce(total, group=ctx.group)
        return total.to(grad.dtype), None


def _mla_kv_a_hook(rope_dim: int, group):
    # kv_a_proj_with_mqa's output is [kv_lora_rank | qk_rope_head_dim]: only the rope part's grad is partial
    def hook(mod, args, out):
        if not torch.is_grad_enabled():
            return None
        latent, rope = out.split([out.shape[-1] - rope_dim, rope_dim], dim=-1)
        return torch.cat([latent, _SumGradOverTP.apply(rope, group)], dim=-1)
    return hook


_SAID = set()


def _say_replicated(module) -> None:
    """The ``replicated_lines`` of ``module`` on stderr, once per process, from global rank 0."""
    if dist.is_initialized() and dist.get_rank() != 0:
        return
    for line in replicated_lines(module):
        if line not in _SAID:
            _SAID.add(line)
            print(line, file=sys.stderr, flush=True)


def apply_tensor_parallel(module, tp_mesh: DeviceMesh) -> List[str]:
    """Split the decoder layers over ``tp_mesh`` by ``tp_plan``; returns the names of the parameters
    whose gradients must be summed over tp after backward (``grad_sum``)."""
    plan = tp_plan(module)
    check_tp_divides(module, tp_mesh.size(), plan=plan)
    _say_replicated(module)
    styles = {name: _tp_style(kind) for name, kind in plan.items() if kind not in WHOLE_KINDS}
    if styles:
        parallelize_module(module, tp_mesh, styles)
    modules = dict(module.named_modules())
    for name, kind in plan.items():
        if kind == "mla_kv_a":
            modules[name].register_forward_hook(_mla_kv_a_hook(module.config.qk_rope_head_dim, tp_mesh.get_group()))
    # names, not objects: FSDP replaces the parameter objects afterwards
    return [f"{name}.{pname}" for name, kind in plan.items() if kind == "grad_sum"
            for pname, _ in modules[name].named_parameters()]


def _mp_policy(spec: ParallelSpec) -> MixedPrecisionPolicy:
    if spec.param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=spec.param_dtype, reduce_dtype=spec.reduce_dtype)


def apply_fsdp(module, dp_mesh: DeviceMesh, param_dtype: Optional[torch.dtype] = None):
    """FSDP2 per decoder layer, then the root; ``param_dtype`` computes in
    lower precision while reducing gradients and keeping master weights in fp32."""
    policy = _mp_policy(ParallelSpec(fsdp=True, param_dtype=param_dtype))
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=dp_mesh, mp_policy=policy)
    fully_shard(module, mesh=dp_mesh, mp_policy=policy)


def apply_replicate(module, dp_mesh: DeviceMesh):
    """DDP semantics over ``dp_mesh``: the whole model one group, one all-reduce per step."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    replicate(module, mesh=dp_mesh)


def parallelize(module, mesh: Optional[DeviceMesh], spec: ParallelSpec = ParallelSpec()) -> None:
    """Lay ``module`` (an HF causal LM) over ``mesh``: DTensor TP over ``tp`` (when > 1), then FSDP2
    (``spec.fsdp``) or replicate over ``dp`` (when > 1). Records on the module the parameters whose
    gradients ``sync_tp_grads`` sums over tp (by name)."""
    tp_mesh, dp_mesh = mesh_dim(mesh, "tp"), mesh_dim(mesh, "dp")
    module._msrl_tp_grad_sum = apply_tensor_parallel(module, tp_mesh) if tp_mesh is not None else []
    module._msrl_tp_group = tp_mesh.get_group() if tp_mesh is not None else None
    if dp_mesh is None:
        if spec.fsdp:
            raise ValueError("FSDP needs a data-parallel size above 1 in the mesh's 'dp' dimension")
        return
    if spec.fsdp:
        apply_fsdp(module, dp_mesh, spec.param_dtype)
    elif any(p.requires_grad for p in module.parameters()):
        apply_replicate(module, dp_mesh)  # a frozen replica needs no gradient reduction


def sync_tp_grads(module) -> None:
    """Sum over tp the gradients of the ``grad_sum`` parameters (one collective)."""
    names = getattr(module, "_msrl_tp_grad_sum", [])
    params = [p for p in (module.get_parameter(n) for n in names) if p.grad is not None]
    if not params:
        return
    grads = [local(p.grad) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=module._msrl_tp_group)
    for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads])):
        g.copy_(part.view_as(g))


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


def _copies(tensor: torch.Tensor, world: int) -> int:
    """Ranks (of ``world``) holding the same local values: a DTensor's shard is unique over its
    Shard dims and repeated over the rest of the world; a plain tensor is the same everywhere."""
    if not isinstance(tensor, DTensor):
        return world
    # Shard and FSDP's _StridedShard (which is not a Shard subclass) both split the values
    unique = math.prod(tensor.device_mesh.size(d) for d, pl in enumerate(tensor.placements)
                       if not pl.is_replicate())
    return max(1, world // unique)


def _norm_group(mesh: Optional[DeviceMesh]):
    # the process group over every rank of the engine's mesh, and its size (None: one process)
    if mesh is None or mesh.size() == 1:
        return None, 1
    if mesh.ndim == 1:
        return mesh.get_group(), mesh.size()
    if dist.get_world_size() == mesh.size():
        return dist.group.WORLD, mesh.size()
    return mesh._flatten().get_group(), mesh.size()


def grad_norm(params: List[torch.nn.Parameter], mesh: Optional[DeviceMesh] = None) -> float:
    """Global L2 norm of the gradients over the ranks of ``mesh``: foreach norms of the local
    shards, each weighted by the number of ranks holding the same values, then ONE all-reduce
    (DTensor aware). Without a mesh, this process's gradients only."""
    group, world = _norm_group(mesh)
    by_copies: Dict[Tuple[int, torch.device, torch.dtype], List[torch.Tensor]] = {}
    device = None
    for p in params:
        if p.grad is None:
            continue
        g = local(p.grad)
        device = g.device
        by_copies.setdefault((_copies(p.grad, world), g.device, g.dtype), []).append(g)
    if device is None:
        return 0.0
    total = torch.zeros((), dtype=torch.float32, device=device)
    for (copies, dev, _), grads in by_copies.items():
        norms = torch._foreach_norm(grads, 2.0)
        sq = torch.stack([n.float() for n in norms]).pow(2).sum()
        total = total + sq.to(device) / copies
    if group is not None:
        dist.all_reduce(total, group=group)
    return math.sqrt(float(total))


def clip_grads(params: List[torch.nn.Parameter], max_norm: float, mesh: Optional[DeviceMesh] = None) -> float:
    """Scale gradients so their global norm is at most ``max_norm`` (foreach); returns the norm
    before clipping. A non-finite norm leaves the gradients as they are (the step is skipped)."""
    norm = grad_norm(params, mesh)
    if math.isfinite(norm) and norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        groups: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
        for p in params:
            if p.grad is not None:
                g = local(p.grad)
                groups.setdefault((g.device, g.dtype), []).append(g)
        for grads in groups.values():
            torch._foreach_mul_(grads, scale)
    return norm


def _chunk(n: int, parts: int, index: int) -> int:
    # size of torch.chunk(range(n), parts)[index] (FSDP2 and DTensor Shard split this way)
    size = -(-n // parts) if parts else n
    return max(0, min(size, n - size * index))


def _fallback_kind(name: str) -> Optional[str]:
    return next((k for suffix, k in TP_PLAN.items() if name.endswith(f"{suffix}.weight")
                 or name.endswith(f"{suffix}.bias")), None)


def planned_local_numel(name: str, shape: Tuple[int, ...], dp: int, tp: int, dp_rank: int = 0,
                        tp_rank: int = 0, fsdp: bool = True, plan: Optional[Dict[str, str]] = None) -> int:
    """Elements of parameter ``name`` held by rank (dp_rank, tp_rank): the TP split of ``plan``
    (``tp_plan(model)``; TP_PLAN by name suffix when None), then FSDP's dim-0 split over dp."""
    shape = list(shape)
    kind = plan.get(name.rsplit(".", 1)[0]) if plan is not None else _fallback_kind(name)
    if kind in ("colwise", "colwise_rep") and tp > 1:
        shape[0] = _chunk(shape[0], tp, tp_rank)
    elif kind in ("rowwise", "rowwise_rep") and tp > 1 and len(shape) == 2:
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
