"""Prompt/label generators for the toy GRPO tasks (see shared/notes/toy-tasks.md)."""
from typing import Dict, List

import torch

from mindspeed_rl.models.tiny_model import BOS_ID, MAX_TOY_LENGTH, SEP_ID, length_token
from mindspeed_rl.utils.token_ids import TOKEN_DTYPE, token_ids

TASKS = ("length", "copy", "tool")
COPY_DIGITS = 3
TOOL_VALUES = 4  # the tool task's labels: 0..3 (a model that does not call the tool guesses one in four)


def make_prompts(task: str, num_prompts: int, seed: int) -> Dict[str, List[torch.Tensor]]:
    """Build num_prompts (prompt, label) pairs for a task; the same seed gives the same data.

    length: prompt [BOS, <L>, SEP], label [L] with L uniform in 1..8.
    copy:   prompt [BOS, d1, d2, d3, SEP], label [d1, d2, d3] with digits uniform in 0..9.
    tool:   prompt [BOS, SEP], label [d] with d uniform in 0..3: only the 'secret' tool (tools/toy_tools.py) tells
            d, so a model that answers without calling it scores at most 0.25 on average (verifier tool_match).
    """
    if task not in TASKS:
        raise ValueError(f"unknown toy task {task!r}; known tasks: {list(TASKS)}")
    if num_prompts < 0:
        raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
    gen = torch.Generator().manual_seed(seed)
    prompts, labels = [], []
    for _ in range(num_prompts):
        if task == "tool":
            prompts.append(token_ids([BOS_ID, SEP_ID]))
            labels.append(token_ids([int(torch.randint(0, TOOL_VALUES, (1,), generator=gen))]))
        elif task == "length":
            length = int(torch.randint(1, MAX_TOY_LENGTH + 1, (1,), generator=gen))
            prompts.append(token_ids([BOS_ID, length_token(length), SEP_ID]))
            labels.append(token_ids([length]))
        else:
            digits = torch.randint(0, 10, (COPY_DIGITS,), generator=gen, dtype=torch.long).to(TOKEN_DTYPE)
            prompts.append(torch.cat([token_ids([BOS_ID]), digits, token_ids([SEP_ID])]))
            labels.append(digits.clone())
    return {"prompts": prompts, "labels": labels}
