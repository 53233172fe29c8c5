"""Tokenize a raw data set once into the cache that training reads (``cli/preprocess_data.py``).

The recipe keys follow the upstream ``configs/datasets/*.yaml`` files: ``input``
(file or folder), ``tokenizer_name_or_path``, ``output_prefix`` (the cache
folder; give it as ``megatron_training.data_path``), ``handler_name``,
``prompt_type``, ``map_keys``, ``dataset_additional_keys``, plus
``system_prompt``. Keys that only tune upstream's writer (workers,
log_interval, ...) are accepted and have no effect.
"""
import os
from typing import Any, Dict

HANDLERS = ("R1AlpacaStyleInstructionHandler", "AlpacaStyleInstructionHandler")
NO_EFFECT = ("workers", "log_interval", "tokenizer_type", "tokenizer_not_use_fast", "seed", "cache_dir",
             "overwrite_cache", "json_keys", "n_subs", "dataset_impl", "append_eod", "make_vocab_size_divisible_by",
             "split_sentences", "keep_newlines", "seq_length", "streaming", "enable_thinking", "prompt_type_path")
USED = ("input", "tokenizer_name_or_path", "output_prefix", "handler_name", "prompt_type", "map_keys",
        "dataset_additional_keys", "system_prompt")


def preprocess(recipe: Dict[str, Any], base_dir: str = None) -> str:
    """Write the cache; returns its folder. Relative paths are taken from base_dir (default: cwd)."""
    from transformers import AutoTokenizer

    from mindspeed_rl.datasets.prompt_dataset import tokenize_prompts
    from mindspeed_rl.datasets.token_cache import save_cache
    unknown = sorted(set(recipe) - set(USED) - set(NO_EFFECT))
    if unknown:
        raise ValueError(f"preprocess recipe: unknown key(s) {unknown}; known: {sorted(USED + NO_EFFECT)}")
    for key in ("input", "tokenizer_name_or_path", "output_prefix"):
        if not recipe.get(key):
            raise ValueError(f"preprocess recipe: {key!r} is required")
    handler = recipe.get("handler_name") or HANDLERS[0]
    if handler not in HANDLERS:
        raise ValueError(f"handler_name {handler!r} is not implemented; known: {list(HANDLERS)}")
    extra = [k for k in recipe.get("dataset_additional_keys") or [] if k != "labels"]
    if extra:
        raise ValueError(f"dataset_additional_keys {extra}: only 'labels' (the tokenized response) is stored")
    base_dir = base_dir or os.getcwd()
    where = lambda p: p if os.path.isabs(p) else os.path.normpath(os.path.join(base_dir, p))  # noqa: E731
    source, output = where(recipe["input"]), where(recipe["output_prefix"])
    tokenizer_path = recipe["tokenizer_name_or_path"]
    if os.path.exists(where(tokenizer_path)):
        tokenizer_path = where(tokenizer_path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    map_keys = dict(recipe["map_keys"]) if recipe.get("map_keys") is not None else None
    prompt_type = recipe.get("prompt_type") or "empty"
    input_ids, labels = tokenize_prompts(source, tokenizer, map_keys, prompt_type, recipe.get("system_prompt"))
    meta = {"source": source, "prompt_type": prompt_type, "map_keys": map_keys,
            "system_prompt": recipe.get("system_prompt"), "tokenizer": tokenizer_path,
            "vocab_size": len(tokenizer), "handler_name": handler}
    save_cache(output, input_ids, labels, meta)
    lengths = sorted(len(ids) for ids in input_ids)
    print(f"preprocess: {len(input_ids)} prompts from {source} -> {output} "
          f"(prompt tokens: min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]})", flush=True)
    return output
