"""Per-sequence workload models used to weigh items before balancing.

``tokens``: cost = L (prompt + response tokens).
``flops``: cost = L + (b / a) * L**2, the forward FLOPs of a decoder-only
transformer divided by its per-token cost ``a``: matrix products cost
``a * L`` and causal attention scores/values ``b * L**2``. Both coefficients
come from the model's dimensions, so the quadratic share is right for any
model size (large for small models with long sequences, tiny for 7B at 1k).
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

OBJECTIVES = ("tokens", "flops")


@dataclass(frozen=True)
class WorkloadModel:
    """cost(L) = linear * L + quadratic * L**2."""

    linear: float = 1.0
    quadratic: float = 0.0

    @classmethod
    def from_dims(cls, hidden_size: int, num_layers: int, num_attention_heads: int,
                  ffn_hidden_size: int, num_kv_heads: Optional[int] = None,
                  vocab_size: int = 0, head_dim: Optional[int] = None,
                  moe: Optional[dict] = None, mla: Optional[dict] = None) -> "WorkloadModel":
        """Forward FLOPs per token (``a``) and per token pair (``b``), scaled so a = 1.

        ``moe`` (MoE layers): ``num_experts``, ``topk``, ``ffn`` (per expert), optional ``shared``
        (shared experts of that width) and ``dense_layers`` (leading layers with the plain MLP of
        ``ffn_hidden_size``); a token runs only its ``topk`` (+ shared) experts: active parameters.
        ``mla`` (multi-latent attention): ``q_lora_rank`` (0/None: plain q projection),
        ``kv_lora_rank``, ``qk_head_dim`` (no-RoPE part), ``qk_pos_emb_head_dim``, ``v_head_dim``."""
        for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers),
                            ("num_attention_heads", num_attention_heads), ("ffn_hidden_size", ffn_hidden_size)):
            if not value or value <= 0:
                raise ValueError(f"WorkloadModel needs a positive {name}, got {value}")
        h, heads = hidden_size, num_attention_heads
        if mla:
            qk = mla["qk_head_dim"] + mla["qk_pos_emb_head_dim"]
            v = mla["v_head_dim"]
            q_lora = mla.get("q_lora_rank") or 0
            q_proj = h * q_lora + q_lora * heads * qk if q_lora else h * heads * qk
            attn = (q_proj + h * (mla["kv_lora_rank"] + mla["qk_pos_emb_head_dim"])
                    + mla["kv_lora_rank"] * heads * (mla["qk_head_dim"] + v) + heads * v * h)
            pair = heads * (qk + v)  # QK^T over qk dims, AV over v dims
        else:
            kv_heads = num_kv_heads or heads
            head_dim = head_dim or h // heads
            q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
            attn = h * q_dim + 2 * h * kv_dim + q_dim * h
            pair = 2 * q_dim
        dense_mlp = 3 * h * ffn_hidden_size  # gated (three-matrix) MLP
        if moe:
            dense_layers = min(int(moe.get("dense_layers") or 0), num_layers)
            active = (moe["topk"] + (moe.get("shared") or 0)) * 3 * h * moe["ffn"] + h * moe["num_experts"]
            mlp_macs = dense_layers * dense_mlp + (num_layers - dense_layers) * active
        else:
            mlp_macs = num_layers * dense_mlp
        # 2 FLOPs per MAC
        a = 2 * (num_layers * attn + mlp_macs) + 2 * h * vocab_size
        # QK^T and AV: 2 FLOPs * L^2 * dims per layer, halved by the causal mask
        b = num_layers * pair
        return cls(linear=1.0, quadratic=b / a)

    @classmethod
    def from_hf_config(cls, config) -> "WorkloadModel":
        """From a transformers config (Qwen2/Qwen3/Llama, Qwen3-MoE, DeepSeek-V3 attribute names)."""
        get = lambda name, default=None: getattr(config, name, default)  # noqa: E731
        moe = mla = None
        experts = get("num_experts") or get("n_routed_experts")
        if experts:
            dense = get("first_k_dense_replace", 0) or 0
            if get("mlp_only_layers"):
                dense = len(get("mlp_only_layers"))
            moe = {"num_experts": experts, "topk": get("num_experts_per_tok"), "ffn": get("moe_intermediate_size"),
                   "shared": get("n_shared_experts", 0) or 0, "dense_layers": dense}
        if get("kv_lora_rank"):
            mla = {"q_lora_rank": get("q_lora_rank"), "kv_lora_rank": get("kv_lora_rank"),
                   "qk_head_dim": get("qk_nope_head_dim"), "qk_pos_emb_head_dim": get("qk_rope_head_dim"),
                   "v_head_dim": get("v_head_dim")}
        return cls.from_dims(
            hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads, ffn_hidden_size=config.intermediate_size,
            num_kv_heads=get("num_key_value_heads"), vocab_size=get("vocab_size", 0) or 0,
            head_dim=None if mla else get("head_dim"), moe=moe, mla=mla)

    @classmethod
    def from_megatron_config(cls, config) -> "WorkloadModel":
        """From a MegatronConfig (upstream key names; MoE/MLA keys read when present)."""
        get = lambda name, default=None: getattr(config, name, default)  # noqa: E731
        kv = get("num_query_groups") if get("group_query_attention", False) else None
        moe = mla = None
        if get("num_experts"):
            moe = {"num_experts": get("num_experts"), "topk": get("moe_router_topk") or 2,
                   "ffn": get("moe_ffn_hidden_size") or get("ffn_hidden_size"),
                   "shared": get("n_shared_experts", 0) or 0, "dense_layers": get("first_k_dense_replace", 0) or 0}
        if get("multi_latent_attention", False) or get("kv_lora_rank"):
            mla = {"q_lora_rank": get("q_lora_rank"), "kv_lora_rank": get("kv_lora_rank"),
                   "qk_head_dim": get("qk_head_dim"), "qk_pos_emb_head_dim": get("qk_pos_emb_head_dim") or 0,
                   "v_head_dim": get("v_head_dim")}
            missing = [k for k in ("kv_lora_rank", "qk_head_dim", "v_head_dim") if not mla[k]]
            if missing:
                raise ValueError(f"multi_latent_attention needs model keys {', '.join(missing)} for the flops "
                                 f"workload")
        return cls.from_dims(
            hidden_size=get("hidden_size"), num_layers=get("num_layers"),
            num_attention_heads=get("num_attention_heads"), ffn_hidden_size=get("ffn_hidden_size"),
            num_kv_heads=kv, vocab_size=get("padded_vocab_size") or 0, head_dim=get("kv_channels"),
            moe=moe, mla=mla)

    def cost(self, lengths) -> np.ndarray:
        length = np.asarray(lengths, dtype=np.float64)
        return self.linear * length + self.quadratic * length * length


def sequence_workloads(prompt_lengths, response_lengths=None, objective: str = "tokens",
                       model: Optional[WorkloadModel] = None) -> np.ndarray:
    """Workload per sequence from its prompt and response lengths (any array-like)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    total = _to_numpy(prompt_lengths)
    if response_lengths is not None:
        resp = _to_numpy(response_lengths)
        if resp.shape != total.shape:
            raise ValueError(f"prompt_lengths {total.shape} and response_lengths {resp.shape} differ in shape")
        total = total + resp
    if objective == "tokens":
        return total
    if model is None:
        raise ValueError("objective 'flops' needs a WorkloadModel (model dimensions)")
    return model.cost(total)


def _to_numpy(values) -> np.ndarray:
    if hasattr(values, "detach"):
        values = values.detach().cpu().numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)
