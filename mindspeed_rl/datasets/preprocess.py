"""Tokenize a raw data set once into the cache that training reads (``cli/preprocess_data.py``).

The recipe keys follow the upstream ``configs/datasets/*.yaml`` files: ``input``
(file or folder), ``tokenizer_name_or_path``, ``output_prefix`` (the cache
folder; give it as ``megatron_training.data_path``), ``handler_name``,
``prompt_type``, ``map_keys``, ``dataset_additional_keys``, ``tokenizer_type``
(HuggingFaceTokenizer), plus ``system_prompt``. ``handler_name``
``Math17kAlpacaStyleInstructionHandler`` reads DAPO-Math-17k's shape (prompt =
chat messages, response = ``{"ground_truth": ...}``) and insists on it; the
Alpaca handlers read text columns. Keys that only tune upstream's writer are
accepted and have no effect (``NO_EFFECT`` says why for each).
"""
import os
from typing import Any, Dict

HANDLERS = ("R1AlpacaStyleInstructionHandler", "AlpacaStyleInstructionHandler",
            "Math17kAlpacaStyleInstructionHandler")
# upstream handlers for other trainers (DPO, PRM): named in a clear error
OTHER_HANDLERS = {"AlpacaStylePairwiseHandler": "pairwise (chosen/rejected) data for DPO",
                  "AlpacaStyleProcessRewardHandler": "process-reward-model data"}
# upstream recipe keys that only tune upstream's own writer: accepted, no effect here (why)
NO_EFFECT = {
    "workers": "one process tokenizes; the cache is written once",
    "log_interval": "one summary line is printed",
    "tokenizer_not_use_fast": "transformers picks the tokenizer class",
    "seed": "rows keep file order; training shuffles with its own seed",
    "cache_dir": "files are read in memory",
    "overwrite_cache": "the output folder is always rewritten",
    "json_keys": "the cache stores prompt ids and labels",
    "n_subs": "one output folder",
    "dataset_impl": "the cache is a datasets folder, not Megatron mmap files",
    "append_eod": "prompts end where the answer starts; no EOD is added",
    "make_vocab_size_divisible_by": "the vocabulary is the tokenizer's",
    "pad_vocab_size_to": "the vocabulary is the tokenizer's",
    "split_sentences": "prompts are not split",
    "keep_newlines": "prompts are not split",
    "seq_length": "long prompts are dropped at training time by rl_config.max_prompt_length",
    "streaming": "files are read in memory",
    "enable_thinking": "only for the qwen3 template of DPO data, which is not preprocessed here",
    "prompt_type_path": "templates are built in (mindspeed_rl/datasets/templates.py)",
    "interleave_probs": "one input",
    "pack": "prompts are not packed at preprocessing",
    "neat_pack": "prompts are not packed at preprocessing",
    "script_data_dir": "no loading scripts; local JSON/JSONL/Parquet only",
    "vocab_file": "HF tokenizers only",
    "merge_file": "HF tokenizers only",
    "placeholder_token": "no process-reward data",
    "reward_tokens": "no process-reward data",
    "merge_group_keys": "no grouped data",
}
USED = ("input", "tokenizer_name_or_path", "output_prefix", "handler_name", "prompt_type", "map_keys",
        "dataset_additional_keys", "system_prompt", "tokenizer_type")


def preprocess(recipe: Dict[str, Any], base_dir: str = None) -> str:
    """Write the cache; returns its folder. Relative paths are taken from base_dir (default: cwd)."""
    from transformers import AutoTokenizer

    from mindspeed_rl.datasets.prompt_dataset import tokenize_prompts
    from mindspeed_rl.datasets.token_cache import save_cache
    unknown = sorted(set(recipe) - set(USED) - set(NO_EFFECT))
    if unknown:
        raise ValueError(f"preprocess recipe: unknown key(s) {unknown}; known: {sorted(USED + tuple(NO_EFFECT))}")
    for key in ("input", "tokenizer_name_or_path", "output_prefix"):
        if not recipe.get(key):
            raise ValueError(f"preprocess recipe: {key!r} is required")
    handler = recipe.get("handler_name") or HANDLERS[0]
    if handler in OTHER_HANDLERS:
        raise ValueError(f"handler_name {handler!r} ({OTHER_HANDLERS[handler]}) is not implemented: GRPO "
                         f"reads prompts and labels; use one of {list(HANDLERS)}")
    if handler not in HANDLERS:
        raise ValueError(f"handler_name {handler!r} is not implemented; known: {list(HANDLERS)}")
    if recipe.get("tokenizer_type", "HuggingFaceTokenizer") != "HuggingFaceTokenizer":
        raise ValueError(f"tokenizer_type {recipe['tokenizer_type']!r} is not implemented; "
                         f"only 'HuggingFaceTokenizer' (a transformers tokenizer folder)")
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
    input_ids, labels = tokenize_prompts(source, tokenizer, map_keys, prompt_type, recipe.get("system_prompt"),
                                         strict_shape=handler.startswith("Math17k"))
    meta = {"source": source, "prompt_type": prompt_type, "map_keys": map_keys,
            "system_prompt": recipe.get("system_prompt"), "tokenizer": tokenizer_path,
            "vocab_size": len(tokenizer), "handler_name": handler}
    save_cache(output, input_ids, labels, meta)
    lengths = sorted(len(ids) for ids in input_ids)
    print(f"preprocess: {len(input_ids)} prompts from {source} -> {output} "
          f"(prompt tokens: min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]})", flush=True)
    return output
