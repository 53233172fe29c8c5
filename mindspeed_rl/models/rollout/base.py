"""The interface both rollout backends keep, and the factory the worker calls."""
from dataclasses import dataclass
from typing import List, Optional

from torch import Tensor


@dataclass
class RolloutResult:
    responses: List[Tensor]                    # new tokens per prompt (up to and including EOS), CPU TOKEN_DTYPE
    log_probs: Optional[List[Tensor]] = None   # the engine's log-prob of each sampled token (vLLM), CPU float


class RolloutBackend:
    """Samples responses from the actor's current policy."""
    name = "base"

    def generate(self, prompts: List[Tensor], sampling, seeds: List[int], eos_id: Optional[int],
                 pad_id: Optional[int]) -> RolloutResult:
        """One response per prompt; ``seeds[i]`` is prompt i's sampling seed (from the rollout seed)."""
        raise NotImplementedError

    def weights_changed(self) -> None:
        """The actor's weights changed (an update, a checkpoint load): the next generate samples from them."""

    def close(self) -> None:
        """Release the engine."""


def make_backend(spec, actor, model_path: str, device, rank: int, world_size: int, seed: int,
                 trust_remote_code: bool = False) -> RolloutBackend:
    """The backend ``spec`` (config_cls.rollout_spec.RolloutSpec) names, over the actor engine ``actor``."""
    if spec.backend == "hf":
        from mindspeed_rl.models.rollout.hf_backend import HFRollout
        return HFRollout(actor)
    if spec.backend == "vllm":
        from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout
        return VLLMRollout(spec, actor, model_path, device, rank, world_size, seed, trust_remote_code)
    raise ValueError(f"unknown rollout backend {spec.backend!r}")
