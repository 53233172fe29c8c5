"""Qwen2: biased q/k/v (add_qkv_bias picks it); vLLM's Qwen2 takes hidden_size / num_attention_heads as the head
size whatever kv_channels says."""
from typing import Optional

from mindspeed_rl.families import Family, hidden_over_heads, register


def _kv_channels_vllm_ignores(cfg) -> Optional[str]:
    kv, head = getattr(cfg, "kv_channels", None), hidden_over_heads(cfg)
    if kv and head and kv != head:
        return (f"vLLM's Qwen2 takes the head size hidden_size / num_attention_heads = {head}, the model section "
                f"sets kv_channels={kv}")
    return None


QWEN2 = register(Family(
    name="qwen2", architecture="Qwen2ForCausalLM", priority=10,
    picks=lambda cfg: bool(getattr(cfg, "add_qkv_bias", False)),
    mapped={"kv_channels": "head_dim"}, qkv_bias=True,
    vllm_head_size=hidden_over_heads, vllm_error=_kv_channels_vllm_ignores, tiny={}))
