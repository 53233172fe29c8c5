"""The interface every rollout backend keeps (the factory by name is registry.make_backend)."""
import time
from typing import Callable, List, Optional

from torch import Tensor

from mindspeed_rl.models.rollout.results import (  # noqa: F401  (the backends' names)
    CARRIED_TURN, ROLLOUT_BUDGET, TURN_STATE, RolloutResult, Served)
from mindspeed_rl.balance.rollout_queue import COMPLETE, CUT


def row_state(response: Tensor, budget: Optional[int], eos_id: Optional[int]) -> int:
    """A finished row's state for the rollout queue: complete when it ended (EOS, or fewer tokens than its
    budget), else cut at its budget (None: max_tokens, where only EOS tells)."""
    ended = (budget is not None and response.numel() < budget) or (eos_id is not None and response.numel() > 0
                                          and int(response[-1]) == int(eos_id))
    return COMPLETE if ended else CUT


class RolloutBackend:
    """Samples responses from the actor's current policy."""
    name = "base"
    agent = None  # multi-turn: the worker's AgentLoop (agent/agent_loop.py); serve then runs conversations

    def generate(self, prompts: List[Tensor], sampling, seeds: List[int], eos_id: Optional[int],
                 pad_id: Optional[int], budgets: Optional[List[int]] = None) -> RolloutResult:
        """One response per prompt; ``seeds[i]`` is prompt i's sampling seed (from the rollout seed);
        ``budgets[i]``: at most that many new tokens for prompt i (partial rollout; default max_tokens)."""
        raise NotImplementedError

    def serve(self, source, sampling, seed_of: Callable[[int], int], eos_id: Optional[int], pad_id: Optional[int],
              chunk: int, clock=time.perf_counter) -> Served:
        """Rows from ``source`` (balance/rollout_queue.py's interface) until it is drained, one ``generate`` per
        take of ``chunk`` rows; row r samples with ``seed_of(r)``."""
        out = Served(log_probs=None)
        begin = clock()
        finished: List[tuple] = []  # (position, length, state) of the last chunk: a stoppable round counts them

        def progress():
            return list(finished)

        while True:
            source.request(chunk, progress)
            got = source.poll(block=True)
            if not got:
                break
            prompts = got.inputs["prompts"]
            start = clock()
            budgets = got.inputs.get(ROLLOUT_BUDGET)
            budgets = [int(b) for b in budgets] if budgets is not None else None
            result = self.generate(prompts, sampling, [seed_of(r) for r in got.ids], eos_id, pad_id, budgets)
            finished = [(p, r.numel(), row_state(r, b, eos_id))
                        for p, r, b in zip(got.positions, result.responses, budgets or [None] * len(prompts))]
            seconds = clock() - start
            longest = max((r.numel() for r in result.responses), default=0)
            out.trace.append((longest, len(prompts), len(prompts) * max(p.numel() for p in prompts), seconds))
            out.rows += got.ids
            out.prompt_lengths += [p.numel() for p in prompts]
            out.responses += result.responses
            out.latency += [seconds] * len(prompts)
            if result.log_probs is not None:
                out.log_probs = (out.log_probs or []) + result.log_probs
        out.busy = clock() - begin
        return out

    def prepare(self) -> None:
        """Before a round: bring the engine's weights up to the actor's (every rank of the actor's mesh calls
        it together: a gather of sharded weights is a collective)."""

    def weights_changed(self) -> None:
        """The actor's weights changed (an update, a checkpoint load): the next generate samples from them."""

    def close(self) -> None:
        """Release the engine."""
