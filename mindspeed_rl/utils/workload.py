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
                  vocab_size: int = 0, head_dim: Optional[int] = None) -> "WorkloadModel":
        """Forward FLOPs per token (``a``) and per token pair (``b``), scaled so a = 1."""
        for name, value in (("hidden_size", hidden_size), ("num_layers", num_layers),
                            ("num_attention_heads", num_attention_heads), ("ffn_hidden_size", ffn_hidden_size)):
            if not value or value <= 0:
                raise ValueError(f"WorkloadModel needs a positive {name}, got {value}")
        kv_heads = num_kv_heads or num_attention_heads
        head_dim = head_dim or hidden_size // num_attention_heads
        q_dim, kv_dim = num_attention_heads * head_dim, kv_heads * head_dim
        # q, k, v, o projections and a gated (three-matrix) MLP, 2 FLOPs per MAC
        per_layer = 2 * (hidden_size * q_dim + 2 * hidden_size * kv_dim + q_dim * hidden_size
                         + 3 * hidden_size * ffn_hidden_size)
        a = num_layers * per_layer + 2 * hidden_size * vocab_size
        # QK^T and AV: 2 * 2 * L^2 * q_dim per layer, halved by the causal mask
        b = num_layers * 2 * q_dim
        return cls(linear=1.0, quadratic=b / a)

    @classmethod
    def from_hf_config(cls, config) -> "WorkloadModel":
        """From a transformers config (Qwen2/Llama style attribute names)."""
        return cls.from_dims(
            hidden_size=config.hidden_size, num_layers=config.num_hidden_layers,
            num_attention_heads=config.num_attention_heads, ffn_hidden_size=config.intermediate_size,
            num_kv_heads=getattr(config, "num_key_value_heads", None),
            vocab_size=getattr(config, "vocab_size", 0), head_dim=getattr(config, "head_dim", None))

    @classmethod
    def from_megatron_config(cls, config) -> "WorkloadModel":
        """From a MegatronConfig (upstream key names)."""
        kv = getattr(config, "num_query_groups", None) if getattr(config, "group_query_attention", False) else None
        return cls.from_dims(
            hidden_size=config.hidden_size, num_layers=config.num_layers,
            num_attention_heads=config.num_attention_heads, ffn_hidden_size=config.ffn_hidden_size,
            num_kv_heads=kv, vocab_size=getattr(config, "padded_vocab_size", None) or 0)

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
