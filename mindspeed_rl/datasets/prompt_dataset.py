"""Prompt batches for GRPO.

``data_path`` is one of:

* ``toy:<task>``: generated toy prompts (a new batch per step);
* a plain JSONL file of ``{"prompt": str, "label": str}`` lines, read when no
  ``map_keys`` and no ``prompt_type`` are given: tokenized as written (no
  template), served in file order, cycling;
* real data: a JSON / JSONL / Parquet file or a folder of them, read with
  ``map_keys`` and rendered with ``prompt_type`` (see ``templates.py``), or a
  token cache written by ``cli/preprocess_data.py`` (see ``token_cache.py``).
  Prompts longer than ``max_prompt_length`` tokens are dropped (counted and
  logged); batches go over the data in epochs, each reshuffled with
  ``seed + epoch`` (``data_order.py``).

``start`` is the data position: the number of batches already served, so a
resumed run continues with the batch it would have drawn next.
"""
import itertools
import json
import os
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from mindspeed_rl.datasets.toy_tasks import make_prompts
from mindspeed_rl.utils.token_ids import token_ids

REAL_DATA_OPTIONS = ("map_keys", "prompt_type", "system_prompt", "max_prompt_length", "shuffle", "split")


def prompt_batches(data_path: str, batch_size: int, seed: int, tokenizer=None,
                   start: int = 0, **options) -> Iterator[Dict[str, list]]:
    """Batches from number ``start`` on (a resumed run starts at its data position).

    options (see ``data_options``): map_keys, prompt_type, system_prompt,
    max_prompt_length, shuffle (default True), split.
    """
    unknown = sorted(set(options) - set(REAL_DATA_OPTIONS))
    if unknown:
        raise TypeError(f"prompt_batches: unknown option(s) {unknown}; known: {list(REAL_DATA_OPTIONS)}")
    if not data_path:
        raise ValueError("megatron_training.data_path is empty: give 'toy:<task>', a data file or folder, "
                         "or a preprocessed cache")
    if data_path.startswith("toy:"):
        task = data_path[len("toy:"):]
        for step in itertools.count(start):
            yield make_prompts(task, batch_size, seed + step)
    if _is_plain_jsonl(data_path, options):
        yield from _plain_jsonl_batches(data_path, batch_size, tokenizer, start)
        return
    input_ids, labels = load_prompts(data_path, tokenizer, **options)
    from mindspeed_rl.datasets.data_order import batch_rows, batches_per_epoch
    batches_per_epoch(len(input_ids), batch_size)  # too few prompts fails on the first batch
    shuffle = options.get("shuffle", True)
    for step in itertools.count(start):
        rows = batch_rows(len(input_ids), batch_size, seed, step, shuffle)
        yield {"prompts": [token_ids(input_ids[r]) for r in rows], "labels": [token_ids(labels[r]) for r in rows]}


def load_prompts(data_path: str, tokenizer=None, map_keys: Optional[Dict[str, str]] = None,
                 prompt_type: Optional[str] = None, system_prompt: Optional[str] = None,
                 max_prompt_length: Optional[int] = None, shuffle: bool = True,
                 split: Optional[str] = None) -> Tuple[List[List[int]], List[List[int]]]:
    """Token ids of the training prompts and labels of a real data set, long prompts dropped."""
    from mindspeed_rl.datasets.raw_files import train_split
    from mindspeed_rl.datasets.token_cache import is_cache, load_cache
    if is_cache(data_path):
        input_ids, labels, meta = load_cache(data_path)
        if prompt_type and prompt_type != meta.get("prompt_type"):
            print(f"data: {data_path} was rendered with prompt_type={meta.get('prompt_type')!r} at "
                  f"preprocessing; prompt_type={prompt_type!r} is not applied again", flush=True)
    else:
        input_ids, labels = tokenize_prompts(data_path, tokenizer, map_keys, prompt_type, system_prompt)
    keep = train_split(len(input_ids), split)
    input_ids, labels = input_ids[:keep], labels[:keep]
    if max_prompt_length is not None:
        kept = [i for i, ids in enumerate(input_ids) if len(ids) <= max_prompt_length]
        dropped = len(input_ids) - len(kept)
        if dropped:
            print(f"data: dropped {dropped} of {len(input_ids)} prompts longer than "
                  f"max_prompt_length={max_prompt_length} tokens", flush=True)
        if not kept:
            raise ValueError(f"every prompt of {data_path!r} is longer than max_prompt_length="
                             f"{max_prompt_length} tokens")
        input_ids, labels = [input_ids[i] for i in kept], [labels[i] for i in kept]
    return input_ids, labels


def tokenize_prompts(data_path: str, tokenizer, map_keys=None, prompt_type=None,
                     system_prompt=None, strict_shape: bool = False) -> Tuple[List[List[int]], List[List[int]]]:
    """Read raw files, render each prompt with its template and tokenize prompt and label.

    The system text of a sample is its mapped ``system`` column, else ``system_prompt``,
    else the template's default.
    """
    from mindspeed_rl.datasets.raw_files import load_raw, map_fields
    from mindspeed_rl.datasets.templates import check_prompt_type, render_prompt
    prompt_type = prompt_type or "empty"
    check_prompt_type(prompt_type)
    fields = map_fields(load_raw(data_path), map_keys, data_path, strict_shape)
    if tokenizer is None:
        raise ValueError(f"data_path {data_path!r}: reading real data needs a tokenizer")
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    input_ids = [encode(render_prompt(p, prompt_type, s or system_prompt, tokenizer))
                 for p, s in zip(fields["prompt"], fields["system"])]
    return input_ids, [encode(r) for r in fields["response"]]


def _is_plain_jsonl(data_path: str, options: Dict) -> bool:
    return (os.path.isfile(data_path) and not options.get("map_keys") and not options.get("prompt_type")
            and os.path.splitext(data_path)[1].lower() not in (".json", ".parquet"))


def _plain_jsonl_batches(data_path: str, batch_size: int, tokenizer, start: int):
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
    encode = (lambda text: token_ids(tokenizer.encode(text, add_special_tokens=False)))
    for first in itertools.count(start * batch_size, batch_size):
        chunk = [rows[(first + i) % len(rows)] for i in range(batch_size)]
        yield {"prompts": [encode(r["prompt"]) for r in chunk], "labels": [encode(r["label"]) for r in chunk]}
