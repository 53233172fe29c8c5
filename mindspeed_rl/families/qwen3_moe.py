"""Qwen3-MoE: routed experts (num_experts picks it) on Qwen3's attention; every layer is sparse, so TP splits no
dense MLP; routed experts are never split over TP (FSDP shards them over DP)."""
from typing import Optional

from mindspeed_rl.families import Family, attention_tp_sizes, register


def _needs_qk_norm(cfg) -> Optional[str]:
    if not getattr(cfg, "qk_layernorm", False):
        return ("model key num_experts is set but qk_layernorm is not: the MoE family run here is "
                "Qwen3-MoE (transformers), which has q/k layer norms; set qk_layernorm: true")
    return None


QWEN3_MOE = register(Family(
    name="qwen3_moe", architecture="Qwen3MoeForCausalLM", priority=30,
    picks=lambda cfg: bool(getattr(cfg, "num_experts", None)),
    mapped={"kv_channels": "head_dim", "num_experts": "num_experts", "moe_router_topk": "num_experts_per_tok",
            "moe_ffn_hidden_size": "moe_intermediate_size", "norm_topk_prob": "norm_topk_prob",
            "moe_aux_loss_coeff": "router_aux_loss_coef"},
    tp_sizes=lambda cfg, splits_attention: attention_tp_sizes(cfg), key_error=_needs_qk_norm,
    tiny=dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
              decoder_sparse_step=1)))
