"""The tokenized prompt cache that ``cli/preprocess_data.py`` writes and training reads.

A cache is a folder written by ``datasets.Dataset.save_to_disk`` (Arrow files)
with two columns of token ids, ``input_ids`` (the templated prompt) and
``labels`` (the answer), plus ``mindspeed_rl_cache.json`` recording how it was
made (source, prompt_type, map_keys, tokenizer, row count). ``data_path`` may
point at the folder; the ids are used as stored, with no template applied again.
"""
import json
import os
from typing import Dict, List, Tuple

META_FILE = "mindspeed_rl_cache.json"


def is_cache(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META_FILE))


def save_cache(path: str, input_ids: List[List[int]], labels: List[List[int]], meta: Dict) -> str:
    import datasets
    if not input_ids:
        raise ValueError("nothing to write: no prompts")
    ds = datasets.Dataset.from_dict({"input_ids": input_ids, "labels": labels})
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    try:
        ds.save_to_disk(path)
    finally:
        if was_enabled:
            datasets.enable_progress_bar()
    with open(os.path.join(path, META_FILE), "w", encoding="utf-8") as f:
        json.dump(dict(meta, num_rows=len(input_ids)), f, indent=2)
    return path


def load_cache(path: str) -> Tuple[List[List[int]], List[List[int]], Dict]:
    import datasets
    with open(os.path.join(path, META_FILE), encoding="utf-8") as f:
        meta = json.load(f)
    ds = datasets.load_from_disk(path)
    missing = [c for c in ("input_ids", "labels") if c not in ds.column_names]
    if missing:
        raise ValueError(f"cache {path!r} lacks column(s) {missing}; its columns are {ds.column_names}")
    if len(ds) == 0:
        raise ValueError(f"cache {path!r} is empty")
    return ds["input_ids"], ds["labels"], meta
