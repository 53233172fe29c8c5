"""One row of a multi-turn rollout: the prompt, the response so far (model turns and tool answers), which of its
tokens the model made, and what its tools did."""
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from mindspeed_rl.utils.token_ids import token_ids

# why a conversation ended
ANSWERED = "answered"          # a turn made no tool call
MAX_TOOL_CALLS = "max_tool_calls"  # max_tool_calls rounds ran; the turn after the last one is final
LENGTH = "length"              # the response reached max_total_response_length (or a turn its budget, no EOS)
CUT = "cut"                    # partial rollout: the pass budget ran out; the row is carried


@dataclass
class Conversation:
    row: int
    prompt: List[int]
    tokens: List[int] = field(default_factory=list)      # the response: model turns and tool answers
    mask: List[int] = field(default_factory=list)        # 1: the model made the token (it trains), 0: a tool's
    log_probs: List[float] = field(default_factory=list)  # the engine's, 0.0 on tool tokens
    turns: int = 0            # model turns
    tool_rounds: int = 0      # tool answers appended (a round answers every call of one turn)
    tool_calls: int = 0       # calls run
    tool_errors: int = 0      # calls that failed, were malformed or named no tool (answered with the error)
    tool_skipped: int = 0     # calls beyond max_parallel_calls in a turn (dropped, as upstream and verl do)
    tool_timeouts: int = 0    # calls past their deadline
    tool_seconds: float = 0.0  # wall time of its rounds
    engine: Optional[int] = None  # the rollout consumer that ran its last turn
    moved: int = 0            # turns run on another consumer than the turn before (free routing)
    stop: Optional[str] = None  # why it ended (None: it goes on)
    ground_truth: Optional[str] = None  # the row's label, given to its tools when they start (create)

    @property
    def done(self) -> bool:
        return self.stop is not None

    def add_turn(self, ids, log_probs: Optional[List[float]] = None) -> None:
        ids = [int(t) for t in ids]
        if log_probs is not None and len(log_probs) != len(ids):
            raise ValueError(f"row {self.row}: a turn of {len(ids)} tokens came with {len(log_probs)} log-probs")
        self.tokens += ids
        self.mask += [1] * len(ids)
        self.log_probs += [float(x) for x in log_probs] if log_probs is not None else [0.0] * len(ids)
        self.turns += 1

    def add_tool_answer(self, ids) -> None:
        ids = [int(t) for t in ids]
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.log_probs += [0.0] * len(ids)
        self.tool_rounds += 1

    def next_prompt(self) -> torch.Tensor:
        """What the engine continues from: the prompt and the response so far."""
        return token_ids(self.prompt + self.tokens)

    def response(self) -> torch.Tensor:
        return token_ids(self.tokens)

    def loss_mask(self) -> torch.Tensor:
        return torch.tensor(self.mask, dtype=torch.int8)

    def stats(self) -> dict:
        return {"turns": self.turns, "tool_rounds": self.tool_rounds, "tool_calls": self.tool_calls,
                "tool_errors": self.tool_errors, "tool_timeouts": self.tool_timeouts, "tool_skipped": self.tool_skipped,
                "tool_seconds": self.tool_seconds, "moved": self.moved, "stop": self.stop}
