"""What a rollout backend returns: one batch's responses, or what one consumer of the rollout queue made."""
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
from torch import Tensor


@dataclass
class RolloutResult:
    responses: List[Tensor]                    # new tokens per prompt (up to and including EOS), CPU TOKEN_DTYPE
    log_probs: Optional[List[Tensor]] = None   # the engine's log-prob of each sampled token (vLLM), CPU float


@dataclass
class Served:
    """What one consumer of the rollout queue made: its rows (in the order they finished), their responses
    (and rollout log-probs), each row's latency in the engine, the engine's trace records
    ``(steps, live, prefill, seconds)`` (utils/rollout_cost.py) and its busy seconds."""
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

    def trace_array(self) -> np.ndarray:
        return np.asarray(self.trace, dtype=np.float64).reshape(-1, 4)
