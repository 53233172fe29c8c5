"""Qwen3: q/k layer norms (qk_layernorm picks it), no q/k/v bias."""
from mindspeed_rl.families import Family, register

QWEN3 = register(Family(
    name="qwen3", architecture="Qwen3ForCausalLM", priority=20,
    picks=lambda cfg: bool(getattr(cfg, "qk_layernorm", False)),
    mapped={"kv_channels": "head_dim"}, tiny=dict(head_dim=16)))
