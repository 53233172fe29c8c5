"""Rollout with transformers ``generate`` on the actor engine itself (always in step with its weights)."""
from mindspeed_rl.models.rollout.base import RolloutBackend, RolloutResult


class HFRollout(RolloutBackend):
    name = "hf"

    def __init__(self, actor):
        self.actor = actor

    def generate(self, prompts, sampling, seeds, eos_id, pad_id) -> RolloutResult:
        # one left-padded batch per share, seeded by the share's first row (seeds[0])
        responses = self.actor.generate(prompts, max_new_tokens=sampling.max_tokens,
                                        temperature=sampling.temperature, top_p=sampling.top_p,
                                        top_k=max(0, sampling.top_k), min_p=sampling.min_p, eos_id=eos_id,
                                        pad_id=pad_id, seed=seeds[0] if seeds else None)
        return RolloutResult(responses)
