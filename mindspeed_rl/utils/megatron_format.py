"""Recognise a checkpoint folder written by Megatron / MindSpeed-LLM (upstream's ``load:``).

Upstream trains from weights converted to Megatron's layout::

    <load>/latest_checkpointed_iteration.txt          # an iteration number or 'release'
    <load>/release/mp_rank_00[_000]/model_optim_rng.pt
    <load>/iter_0000100/mp_rank_00_000/model_optim_rng.pt
    <load>/iter_0000100/{metadata.json, common.pt, *.distcp}   # torch_dist format

This implementation reads HF weights (``model_path``) and its own checkpoints
(``iter_XXXXXXX/dcp``), so such a folder is named in an error before anything starts.
"""
import os
import re
from typing import Optional

TRACKER = "latest_checkpointed_iteration.txt"
_RANK_DIR = re.compile(r"^mp_rank_\d{2}(_\d{3})?(_\d{3})?$")
_ITER_DIR = re.compile(r"^(iter_\d{7}|release)$")


def _in_iteration_dir(folder: str) -> Optional[str]:
    """The Megatron file inside one iteration folder (relative path), or None."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    for name in names:
        sub = os.path.join(folder, name)
        if _RANK_DIR.match(name) and os.path.isdir(sub):
            for pt in sorted(os.listdir(sub)):
                if pt.endswith(".pt"):
                    return os.path.join(name, pt)
    if "common.pt" in names and "metadata.json" in names:  # Megatron's torch_dist format
        return "common.pt"
    return None


def find_megatron_checkpoint(path: str) -> Optional[str]:
    """If ``path`` is a Megatron-format checkpoint (a save root with such iteration
    folders, or one iteration folder), return the file that shows it, else None."""
    if not path or not os.path.isdir(path):
        return None
    found = _in_iteration_dir(path)  # path is iter_XXXXXXX/ or release/ itself
    if found:
        return os.path.join(path, found)
    candidates = []
    tracker = os.path.join(path, TRACKER)
    if os.path.isfile(tracker):
        with open(tracker, "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
        if text == "release":
            candidates.append("release")
        elif text.isascii() and text.isdigit():  # anything else is not Megatron's; named by checkpoint.find
            candidates.append(f"iter_{int(text):07d}")
    candidates += sorted(n for n in os.listdir(path) if _ITER_DIR.match(n) and n not in candidates)
    for name in candidates:
        found = _in_iteration_dir(os.path.join(path, name))
        if found:
            return os.path.join(path, name, found)
    return None


def megatron_load_error(key: str, path: str, hf_folder: Optional[str] = None) -> Optional[str]:
    """One-line message when ``path`` (given as ``key``) is in Megatron format, else None."""
    found = find_megatron_checkpoint(path)
    if found is None:
        return None
    hint = (f" (tokenizer_name_or_path={hf_folder!r} is taken as that folder when model_path is unset)"
            if hf_folder else "")
    return (f"{key}={path!r} is a Megatron-format checkpoint ({found}), which this implementation does not "
            f"read: give the HF weights folder (config.json + *.safetensors) as megatron_training.model_path"
            f"{hint} and remove {key}; {key} is only for checkpoints this implementation saved")
