"""Rollout with transformers ``generate`` on the actor engine itself (always in step with its weights)."""
import time

from mindspeed_rl.models.rollout.agent_serve import serve_blocking
from mindspeed_rl.models.rollout.base import RolloutBackend, RolloutResult
from mindspeed_rl.models.rollout.registry import register_backend


@register_backend("hf")
def make_hf(spec, actor, *_):
    """The actor's own generate; log-probs when the plan's rollout spec asks for them."""
    return HFRollout(actor, log_probs=spec.returns_log_probs)


class HFRollout(RolloutBackend):
    name = "hf"

    def __init__(self, actor, log_probs: bool = False):
        """``log_probs``: also return each sampled token's log-prob after temperature / top-k / top-p (as vLLM's
        processed log-probs), for rollout correction."""
        self.actor, self.log_probs = actor, log_probs

    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None) -> RolloutResult:
        # one left-padded batch per share, seeded by the share's first row (seeds[0]); a row with a smaller
        # budget than the batch's largest is cut to it
        most = max(budgets) if budgets else sampling.max_tokens
        out = self.actor.generate(prompts, max_new_tokens=most, temperature=sampling.temperature,
                                  top_p=sampling.top_p, top_k=max(0, sampling.top_k), min_p=sampling.min_p,
                                  eos_id=eos_id, pad_id=pad_id, seed=seeds[0] if seeds else None,
                                  with_log_probs=self.log_probs)
        responses, log_probs = out if self.log_probs else (out, None)
        if budgets:
            responses = [r[:b] for r, b in zip(responses, budgets)]
            log_probs = [lp[:b] for lp, b in zip(log_probs, budgets)] if log_probs is not None else None
        return RolloutResult(responses, log_probs)

    def serve(self, source, sampling, seed_of, eos_id, pad_id, chunk, clock=time.perf_counter):
        if self.agent is not None:  # multi-turn: each take's conversations turn by turn
            return serve_blocking(self, self.agent, source, sampling, seed_of, eos_id, pad_id, chunk, clock,
                                  with_log_probs=self.log_probs)
        return super().serve(source, sampling, seed_of, eos_id, pad_id, chunk, clock)
