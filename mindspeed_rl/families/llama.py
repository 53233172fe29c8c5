"""Llama: the default family (no MLA, no experts, no q/k norms, no q/k/v bias)."""
from mindspeed_rl.families import Family, register

LLAMA = register(Family(
    name="llama", architecture="LlamaForCausalLM", priority=0, picks=lambda cfg: True,
    mapped={"kv_channels": "head_dim"}, tiny=dict(head_dim=16)))
