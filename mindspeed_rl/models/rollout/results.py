"""What a rollout backend returns: one batch's responses, or what one consumer of the rollout queue made; the
columns partial rollout adds to a rollout's inputs and outputs."""
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
from torch import Tensor

# partial rollout: the rollout input column of each row's new-token budget for this pass
ROLLOUT_BUDGET = "rollout_budget"
# multi-turn with partial rollout (trainer/utils/carried_turns.py): a carried conversation's state into a pass
# (int64: its response tokens so far, tool rounds and calls so far, where its cut turn began or -1) and out of it
# (int64: 1 if the pass cut it, where its cut turn began or -1, its tool calls in the pass)
CARRIED_TURN = "carried_turn"
TURN_STATE = "turn_state"


@dataclass
class RolloutResult:
    responses: List[Tensor]                    # new tokens per prompt (up to and including EOS), CPU TOKEN_DTYPE
    log_probs: Optional[List[Tensor]] = None   # the engine's log-prob of each sampled token (vLLM), CPU float


@dataclass
class Served:
    """What one consumer of the rollout queue made: its rows (in the order they finished), their responses
    (and rollout log-probs), each row's latency in the engine, the engine's trace records
    ``(steps, live, prefill, seconds)`` (balance/rollout_cost.py) and its busy seconds."""
    rows: List[int] = field(default_factory=list)
    prompt_lengths: List[int] = field(default_factory=list)
    responses: List[Tensor] = field(default_factory=list)
    log_probs: Optional[List[Tensor]] = None
    latency: List[float] = field(default_factory=list)
    trace: List[tuple] = field(default_factory=list)
    busy: float = 0.0
    # multi-turn: each row's loss mask (1: the model's token) and tool figures (agent/conversation.py), and the
    # seconds the engine waited on tools with nothing else to run
    masks: Optional[List[Tensor]] = None
    turn_stats: Optional[List[dict]] = None
    tool_wait: float = 0.0
    # seconds while a row of the engine's waited on its tool: in all, and those the engine spent stepping others
    tool_running: float = 0.0
    tool_busy: float = 0.0

    def trace_array(self) -> np.ndarray:
        return np.asarray(self.trace, dtype=np.float64).reshape(-1, 4)

    @classmethod
    def joined(cls, parts: List["Served"]) -> "Served":
        """Several serves' rows one after the other (figures added up)."""
        out = cls(log_probs=[] if parts and parts[0].log_probs is not None else None,
                  masks=[] if parts and parts[0].masks is not None else None,
                  turn_stats=[] if parts and parts[0].turn_stats is not None else None)
        for part in parts:
            for name in ("rows", "prompt_lengths", "responses", "latency", "trace", "log_probs", "masks",
                         "turn_stats"):
                if getattr(out, name) is not None:
                    getattr(out, name).extend(getattr(part, name))
            out.busy += part.busy
            out.tool_wait += part.tool_wait
            out.tool_running += part.tool_running
            out.tool_busy += part.tool_busy
        return out

    def ordered(self, rows: List[int]) -> "Served":
        """The same rows in the order ``rows`` gives (every served row once)."""
        where = {row: i for i, row in enumerate(self.rows)}
        if sorted(where) != sorted(rows):
            raise ValueError(f"served rows {sorted(where)} are not the rows {sorted(rows)}")
        idx = [where[r] for r in rows]

        def pick(values):
            return None if values is None else [values[i] for i in idx]

        return Served(rows=list(rows), prompt_lengths=pick(self.prompt_lengths), responses=pick(self.responses),
                      log_probs=pick(self.log_probs), latency=pick(self.latency), trace=list(self.trace),
                      busy=self.busy, masks=pick(self.masks), turn_stats=pick(self.turn_stats),
                      tool_wait=self.tool_wait, tool_running=self.tool_running, tool_busy=self.tool_busy)
