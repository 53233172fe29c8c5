"""DeepSeek-V3: multi-latent attention (multi_latent_attention, q_lora_rank or kv_lora_rank picks it), routed and
shared experts, the first first_k_dense_replace layers dense (HF default 3). One latent serves every head, so HF
builds as many KV heads as heads. TP splits the heads only where the installed transformers' plan splits MLA (from
5.25), the dense MLP where there are dense layers, and the shared experts."""
from mindspeed_rl.families import Family, register


def _picks(cfg) -> bool:
    return bool(getattr(cfg, "multi_latent_attention", False) or getattr(cfg, "q_lora_rank", None)
                or getattr(cfg, "kv_lora_rank", None))


def _tp_sizes(cfg, splits_attention):
    sizes = [("num_attention_heads", cfg.num_attention_heads)] if splits_attention("deepseek_v3") else []
    dense = getattr(cfg, "first_k_dense_replace", None)
    if dense is None or dense > 0:
        sizes.append(("ffn_hidden_size", cfg.ffn_hidden_size))
    shared = getattr(cfg, "n_shared_experts", None)
    shared = 1 if shared is None else shared
    moe_ffn = getattr(cfg, "moe_ffn_hidden_size", None)
    if shared and moe_ffn is not None:
        sizes.append(("moe_ffn_hidden_size * n_shared_experts (shared experts)", moe_ffn * shared))
    return sizes


DEEPSEEK_V3 = register(Family(
    name="deepseek_v3", architecture="DeepseekV3ForCausalLM", priority=40, picks=_picks,
    mapped={"num_experts": "n_routed_experts", "moe_router_topk": "num_experts_per_tok",
            "moe_ffn_hidden_size": "moe_intermediate_size", "norm_topk_prob": "norm_topk_prob",
            "n_shared_experts": "n_shared_experts", "first_k_dense_replace": "first_k_dense_replace",
            "moe_router_num_groups": "n_group", "moe_router_group_topk": "topk_group",
            "moe_router_topk_scaling_factor": "routed_scaling_factor",
            "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
            "qk_head_dim": "qk_nope_head_dim", "qk_pos_emb_head_dim": "qk_rope_head_dim",
            "v_head_dim": "v_head_dim"},
    kv_heads=lambda cfg: cfg.num_attention_heads, tp_sizes=_tp_sizes, vllm_head_size=lambda cfg: None,
    tiny=dict(num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
              v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, rope_scaling=None)))
