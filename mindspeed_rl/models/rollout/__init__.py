"""Rollout backends: transformers ``generate`` on the actor (``hf``) or an in-process vLLM engine per rank
(``vllm``), chosen by ``generate_config.rollout_backend`` (config_cls/rollout_spec.py)."""
from mindspeed_rl.models.rollout.base import RolloutBackend, RolloutResult, make_backend

__all__ = ["RolloutBackend", "RolloutResult", "make_backend"]
