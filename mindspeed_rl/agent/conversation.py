"""One row of a multi-turn rollout: the prompt, the response so far (model turns and tool answers), which of its
tokens the model made, and what its tools did.

Partial rollout continues a conversation over several passes: a pass resumes it from the response carried so far
(``start`` tokens, ``rounds_before`` tool rounds, ``calls_before`` calls, ``turn_start``: where a turn the last pass
cut began), makes at most ``budget`` new tokens, and reports only what it made (its part of ``tokens``, the mask and
log-probs of that part, its own turns and tool figures)."""
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
    # partial rollout (the module's docstring): mask and log_probs cover tokens[start:], the counts this pass
    start: int = 0
    rounds_before: int = 0
    calls_before: int = 0
    turn_start: Optional[int] = None  # index in tokens where a turn cut by a pass began; None between turns
    budget: Optional[int] = None      # new tokens this pass may make (None: no pass limit)

    @property
    def done(self) -> bool:
        return self.stop is not None

    @property
    def all_rounds(self) -> int:
        """Tool rounds of the whole conversation, earlier passes included."""
        return self.rounds_before + self.tool_rounds

    @property
    def pass_left(self) -> Optional[int]:
        """New tokens this pass may still make (None: no pass limit; below 0 after a long tool answer)."""
        return None if self.budget is None else self.budget - (len(self.tokens) - self.start)

    @property
    def prompt_length(self) -> int:
        """What this pass began from: the prompt and the response carried in."""
        return len(self.prompt) + self.start

    def add_turn(self, ids, log_probs: Optional[List[float]] = None) -> None:
        """Tokens of a model turn: a new one, or the rest of the turn a pass cut (``turn_start`` set)."""
        ids = [int(t) for t in ids]
        if log_probs is not None and len(log_probs) != len(ids):
            raise ValueError(f"row {self.row}: a turn of {len(ids)} tokens came with {len(log_probs)} log-probs")
        if self.turn_start is None:
            self.turns += 1
        self.tokens += ids
        self.mask += [1] * len(ids)
        self.log_probs += [float(x) for x in log_probs] if log_probs is not None else [0.0] * len(ids)

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
        """This pass's part of the response (all of it without partial rollout)."""
        return token_ids(self.tokens[self.start:])

    def loss_mask(self) -> torch.Tensor:
        return torch.tensor(self.mask, dtype=torch.int8)

    def stats(self) -> dict:
        """This pass's figures; ``called``: the conversation ran a tool call, in any pass; ``turn_start``: where
        the running turn began (-1: none)."""
        return {"turns": self.turns, "tool_rounds": self.tool_rounds, "tool_calls": self.tool_calls,
                "tool_errors": self.tool_errors, "tool_timeouts": self.tool_timeouts, "tool_skipped": self.tool_skipped,
                "tool_seconds": self.tool_seconds, "moved": self.moved, "stop": self.stop,
                "called": self.calls_before + self.tool_calls > 0,
                "turn_start": -1 if self.turn_start is None else self.turn_start}


# partial rollout's two columns (models/rollout/results.py), one int64 row each
def carried_row(tokens: int, rounds: int, calls: int, turn_start: int) -> torch.Tensor:
    """CARRIED_TURN: a carried conversation into a pass: its response tokens so far, its tool rounds and calls so
    far, where the turn its last pass cut began (-1: none)."""
    return torch.tensor([tokens, rounds, calls, turn_start], dtype=torch.int64)


def turn_state_row(stats: dict) -> torch.Tensor:
    """TURN_STATE: a conversation out of a pass (from its ``stats()``): 1 if the pass cut it, where the cut turn
    began (-1: none), its tool calls in the pass."""
    return torch.tensor([int(stats["stop"] == CUT), stats["turn_start"], stats["tool_calls"]], dtype=torch.int64)
