"""Rollout backends: transformers ``generate`` on the actor (``hf``) or an in-process vLLM engine per rank
(``vllm``), chosen by ``generate_config.rollout_backend`` (plan/rollout_spec.py); each registers itself by name
(registry.py)."""
from mindspeed_rl.models.rollout.base import RolloutBackend, RolloutResult
from mindspeed_rl.models.rollout.registry import backend_names, make_backend, register_backend

__all__ = ["RolloutBackend", "RolloutResult", "backend_names", "make_backend", "register_backend"]
