"""Partial rollout's pool rows of a multi-turn run (trainer/utils/carry_pool.py): beside its tokens and log-probs a
row keeps a loss mask (int8 per token; 1: the model made it, 0: a tool's answer) and its conversation's state
between passes: tool rounds and calls so far, and where a turn its last pass cut began (-1: none). A pass hands that
state to the rollout (CARRIED_TURN) and gets back what the pass made (its part of the mask, its tool rounds, and
TURN_STATE: cut or ended, the cut turn's start, its calls); a row is complete once its conversation ended for any
reason but the pass's cut."""
from typing import Dict, List, Optional, Sequence

import torch

from mindspeed_rl.agent.conversation import carried_row
from mindspeed_rl.plan.stages import LOSS_MASK, TOOL_CALLS, TURN_STATE

# the rollout outputs a pass of a multi-turn pool reads
PASS_COLUMNS = (LOSS_MASK, TOOL_CALLS, TURN_STATE)
# a row's fields: (what it must be)
TURN_FIELDS = {"mask": "a 1-D int8 tensor of 0 and 1", "tool_rounds": "an int >= 0", "tool_calls": "an int >= 0",
               "turn_start": "an int >= -1"}


def new_fields() -> dict:
    return {"mask": torch.zeros(0, dtype=torch.int8), "tool_rounds": 0, "tool_calls": 0, "turn_start": -1}


def pass_column(rows: Sequence[dict]) -> List[torch.Tensor]:
    """CARRIED_TURN of ``rows``: what each pass resumes its conversation from."""
    return [carried_row(r["tokens"].numel(), r["tool_rounds"], r["tool_calls"], r["turn_start"]) for r in rows]


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mask_problem(mask) -> bool:
    return (not isinstance(mask, torch.Tensor) or mask.dim() != 1 or mask.dtype != torch.int8
            or bool(((mask != 0) & (mask != 1)).any()))


def _start_problem(mask: torch.Tensor, start: int, done: bool) -> Optional[str]:
    """What is wrong with a cut turn beginning at ``start`` (-1: none) of a response with ``mask``."""
    if start < 0:
        return None
    if done:
        return f"is {start}, but the row is complete (only a row a pass cut has a running turn)"
    if start >= mask.numel() or not bool(mask[start:].all()) or (start and int(mask[start - 1]) != 0):
        return (f"is {start}, not where a model turn of its {mask.numel()}-token response begins (the turn's "
                f"tokens are the model's and end the response, a tool answer or the start comes before)")
    return None


def row_problem(k: int, row: dict) -> Optional[str]:
    """What makes row ``k`` of a saved multi-turn pool unusable, naming the field (None: usable)."""
    for name, what in TURN_FIELDS.items():
        if name not in row:
            return f"row {k} lacks '{name}' (a multi-turn pool's row)"
        value = row[name]
        bad = _mask_problem(value) if name == "mask" else (
            not _int(value) or value < (-1 if name == "turn_start" else 0))
        if bad:
            shown = (f"a {value.dim()}-D {value.dtype} tensor" if isinstance(value, torch.Tensor) and
                     (value.dim() != 1 or value.dtype != torch.int8) else
                     "a tensor with values other than 0 and 1" if isinstance(value, torch.Tensor) else repr(value))
            return f"row {k}'s '{name}' is {shown}, not {what}"
    if row["mask"].numel() != row["tokens"].numel():
        return f"row {k} has {row['tokens'].numel()} tokens and a loss mask of {row['mask'].numel()}"
    problem = _start_problem(row["mask"], row["turn_start"], row["done"])
    return f"row {k}'s 'turn_start' {problem}" if problem else None


def pass_problem(k: int, row: dict, new: torch.Tensor, made: Dict[str, object], budget: int,
                 max_tokens: int) -> Optional[str]:
    """What is wrong with what a pass made for row ``k`` of the pass (``made``: its PASS_COLUMNS), None: fine.
    The pass's model tokens stay within its ``budget`` (a tool answer may run past it: it ends the pass)."""
    mask, state = made[LOSS_MASK].reshape(-1), made[TURN_STATE].reshape(-1)
    if mask.numel() != new.numel() or bool(((mask != 0) & (mask != 1)).any()):
        return f"row {k} of the pass has a loss mask of {mask.numel()} values for {new.numel()} tokens, or not 0/1"
    if int(mask.sum()) > budget or row["tokens"].numel() + new.numel() > max_tokens:
        return (f"row {k} of the pass made {int(mask.sum())} model tokens ({new.numel()} in all), over its budget "
                f"of {budget} or the row's {max_tokens}")
    if state.numel() != 3 or int(state[0]) not in (0, 1) or int(made[TOOL_CALLS].reshape(-1)[0]) < 0 \
            or int(state[2]) < 0:
        return f"row {k} of the pass has a turn state {state.tolist()}, not [cut 0/1, turn start, calls >= 0]"
    whole = torch.cat([row["mask"], mask.to(torch.int8)])
    problem = _start_problem(whole, int(state[1]), not bool(state[0]))
    return f"row {k} of the pass: its cut turn's start {problem}" if problem else None


def apply_pass(row: dict, made: Dict[str, object]) -> bool:
    """Append a checked pass's mask and turn state to ``row``; True when its conversation ended."""
    state = made[TURN_STATE].reshape(-1)
    row["mask"] = torch.cat([row["mask"], made[LOSS_MASK].reshape(-1).to(torch.int8)])
    row["tool_rounds"] += int(made[TOOL_CALLS].reshape(-1)[0])
    row["tool_calls"] += int(state[2])
    row["turn_start"] = int(state[1])
    return not bool(state[0])


def take_columns(taken: Sequence[dict]) -> Dict[str, list]:
    """The train round's multi-turn columns, as a straight multi-turn rollout writes them."""
    return {LOSS_MASK: [r["mask"] for r in taken],
            TOOL_CALLS: [torch.tensor([r["tool_rounds"]], dtype=torch.int32) for r in taken]}
