"""Prompt batches for GRPO: toy tasks (``toy:<task>``) or a JSONL file.

A JSONL line is ``{"prompt": str, "label": str}``; both are tokenized with
the model's tokenizer (no chat template). Batches cycle through the file.
"""
import itertools
import json
import os
from typing import Dict, Iterator

import torch

from mindspeed_rl.datasets.toy_tasks import make_prompts


def prompt_batches(data_path: str, batch_size: int, seed: int, tokenizer=None,
                   start: int = 0) -> Iterator[Dict[str, list]]:
    """Batches from number ``start`` on (a resumed run starts at its data position)."""
    if not data_path:
        raise ValueError("megatron_training.data_path is empty: give 'toy:<task>' or a JSONL file")
    if data_path.startswith("toy:"):
        task = data_path[len("toy:"):]
        for step in itertools.count(start):
            yield make_prompts(task, batch_size, seed + step)
    if not os.path.isfile(data_path):
        raise FileNotFoundError(f"data_path {data_path!r} is neither 'toy:<task>' nor a file")
    rows = []
    with open(data_path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                item = json.loads(line)
                if "prompt" not in item or "label" not in item:
                    raise ValueError(f"{data_path}:{number}: each line needs 'prompt' and 'label'")
                rows.append(item)
    if len(rows) < batch_size:
        raise ValueError(f"{data_path} has {len(rows)} prompts, fewer than global_batch_size {batch_size}")
    encode = (lambda text: torch.tensor(tokenizer.encode(text, add_special_tokens=False), dtype=torch.long))
    for first in itertools.count(start * batch_size, batch_size):
        chunk = [rows[(first + i) % len(rows)] for i in range(batch_size)]
        yield {"prompts": [encode(r["prompt"]) for r in chunk], "labels": [encode(r["label"]) for r in chunk]}
