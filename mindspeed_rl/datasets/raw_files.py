"""Read raw prompt files (JSON, JSONL, Parquet, or a folder of them) and map their fields.

Files are read with the ``datasets`` library from local paths only. ``map_keys``
follows the preprocessing recipes: ``prompt`` and ``response`` (the label) name
columns of the file; optional ``query`` (appended to the prompt on a new line) and
``system`` (the sample's system text). An empty string means "not mapped".
DAPO-Math-17k's shape is read too: a prompt column of chat messages and a
response column of ``{"ground_truth": ...}`` dicts.
"""
import os
from typing import Dict, List, Optional

_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}
DEFAULT_MAP_KEYS = {"prompt": "prompt", "response": "label"}
_ROLES = ("prompt", "query", "response", "system")


def data_files(path: str) -> List[str]:
    """The files a data path names: itself, or the JSON/JSONL/Parquet files of a folder (sorted)."""
    if os.path.isfile(path):
        if os.path.splitext(path)[1].lower() not in _FORMATS:
            raise ValueError(f"data file {path!r}: expected .json, .jsonl or .parquet")
        return [path]
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if os.path.splitext(f)[1].lower() in _FORMATS)
        if not files:
            raise ValueError(f"data folder {path!r} holds no .json, .jsonl or .parquet file")
        kinds = {_FORMATS[os.path.splitext(f)[1].lower()] for f in files}
        if len(kinds) > 1:
            raise ValueError(f"data folder {path!r} mixes JSON and Parquet files; keep one kind")
        return files
    raise FileNotFoundError(f"data_path {path!r} is neither 'toy:<task>' nor an existing file or folder")


def load_raw(path: str):
    """A ``datasets.Dataset`` of all rows of the files under path, in file order."""
    import datasets
    files = data_files(path)
    files = [f for f in files if not _blank(f)]
    if not files:
        raise ValueError(f"data set {path!r} is empty")
    kind = _FORMATS[os.path.splitext(files[0])[1].lower()]
    if kind == "json":
        for f in files:
            check_json_file(f)
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bar()
    try:
        ds = datasets.load_dataset(kind, data_files=files, split="train", keep_in_memory=True)
    finally:
        if was_enabled:
            datasets.enable_progress_bar()
    if len(ds) == 0:
        raise ValueError(f"data set {path!r} is empty")
    return ds


def check_json_file(path: str) -> None:
    """A JSON or JSONL data file must be UTF-8 and parse: one whole JSON document, or one
    JSON value per line. Raises ValueError naming the file, line and column."""
    import json
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        column = err.start - (raw.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(f"data file {path!r} line {line}, column {column}: not UTF-8 "
                         f"(byte 0x{raw[err.start]:02x}); save the file as UTF-8") from None
    if path.lower().endswith(".json"):
        try:
            json.loads(text)
            return
        except ValueError:
            pass  # JSON lines in a .json file
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            json.loads(line)
        except ValueError as err:
            raise ValueError(f"data file {path!r} line {number}: not valid JSON ({err.msg} at column "
                             f"{err.colno}): {line.strip()[:60]!r}") from None


def _blank(path: str) -> bool:
    """A JSON/JSONL file with nothing but white space (the loader cannot read those)."""
    if path.lower().endswith(".parquet") or os.path.getsize(path) > 4096:
        return False
    with open(path, "rb") as f:
        return not f.read().strip()


def check_map_keys(map_keys: Optional[Dict[str, str]]) -> Dict[str, str]:
    """map_keys with empty entries dropped; prompt and response must be mapped."""
    keys = dict(DEFAULT_MAP_KEYS if map_keys is None else map_keys)
    unknown = sorted(set(keys) - set(_ROLES))
    if unknown:
        raise ValueError(f"map_keys: unknown field(s) {unknown}; known: {list(_ROLES)}")
    keys = {role: column for role, column in keys.items() if column}
    for role in ("prompt", "response"):
        if role not in keys:
            raise ValueError(f"map_keys must name the {role!r} column, got {map_keys}")
    return keys


def map_fields(ds, map_keys: Optional[Dict[str, str]], source: str,
               strict_shape: bool = False) -> Dict[str, List[str]]:
    """Columns ``prompt``, ``response`` and ``system`` as lists of strings (see ``_as_text``)."""
    keys = check_map_keys(map_keys)
    for role, column in keys.items():
        if column not in ds.column_names:
            raise ValueError(f"map_keys[{role!r}] = {column!r}: no such column in {source!r}; "
                             f"its columns are {ds.column_names}")
    text = lambda role: [_as_text(v, role, keys[role], row, source, strict_shape)  # noqa: E731
                         for row, v in enumerate(ds[keys[role]])]
    prompts = text("prompt")
    if "query" in keys:
        prompts = [p + "\n" + q if q else p for p, q in zip(prompts, text("query"))]
    systems = text("system") if "system" in keys else [""] * len(prompts)
    return {"prompt": prompts, "response": text("response"), "system": systems}


def _as_text(value, role: str, column: str, row: int, source: str, strict_shape: bool) -> str:
    """A cell as text. Chat-message lists (DAPO-Math-17k's ``prompt``) give the first
    message's content; a dict with ``ground_truth`` (its ``reward_model``) gives that.
    ``strict_shape`` (the Math17k handler) requires exactly these shapes for prompt and response."""
    where = f"{source!r} row {row}, column {column!r} (map_keys[{role!r}])"
    if isinstance(value, list) and value and all(isinstance(m, dict) and "content" in m for m in value):
        return str(value[0]["content"])
    if isinstance(value, dict):
        if "ground_truth" not in value:
            raise ValueError(f"{where}: a dict without 'ground_truth' (keys {sorted(value)})")
        return str(value["ground_truth"])
    if strict_shape and role in ("prompt", "response"):
        want = "a list of chat messages" if role == "prompt" else "a dict with 'ground_truth'"
        raise ValueError(f"{where}: Math17kAlpacaStyleInstructionHandler expects {want}, got {value!r:.80}")
    if isinstance(value, (list, dict)):
        raise ValueError(f"{where}: expected text, got {value!r:.80}")
    return "" if value is None else str(value)


def train_split(num_rows: int, split: Optional[str]) -> int:
    """Rows used for training under a Megatron-style ``split`` ('98,2,0'): the leading share, in file order."""
    if not split:
        return num_rows
    try:
        parts = [float(p) for p in str(split).replace("/", ",").split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"megatron_training.split {split!r}: expected numbers like '98,2,0'") from None
    if not parts or any(p < 0 for p in parts) or sum(parts) <= 0 or parts[0] <= 0:
        raise ValueError(f"megatron_training.split {split!r}: needs a positive first (training) share")
    return max(1, int(round(num_rows * parts[0] / sum(parts))))
