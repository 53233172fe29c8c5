"""Inputs of the DP balance report: per-sequence lengths files and a run's ``balance.jsonl``."""
import csv
import json
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

LENGTH_FIELDS = ("prompt_length", "response_length")
BALANCE_FILE = "balance.jsonl"


class ReportError(Exception):
    """A user-facing problem with the input; ``main`` prints it as one line."""


@dataclass
class Lengths:
    """Per-row lengths read from a file; ``prompt_ids`` is None when the file has none."""

    prompt: np.ndarray
    response: np.ndarray
    prompt_ids: Optional[List[str]] = None
    source: str = ""


# ---------------------------------------------------------------- lengths input


def _number(value, name: str, where: str) -> float:
    """A finite, non-negative number from a JSON value or a CSV cell."""
    if isinstance(value, bool) or value is None:
        raise ReportError(f"{where}: {name} must be a number, got {json.dumps(value)}")
    if isinstance(value, str):
        try:
            num = float(value.strip())
        except ValueError:
            raise ReportError(f"{where}: {name} must be a number, got {value!r}") from None
    elif isinstance(value, (int, float)):
        num = float(value)
    else:
        raise ReportError(f"{where}: {name} must be a number, got {json.dumps(value)}")
    if not math.isfinite(num):
        raise ReportError(f"{where}: {name} must be finite, got {value}")
    if num < 0:
        raise ReportError(f"{where}: negative {name} {value}")
    return num


def _file_format(path: str, text: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext == ".csv":
        return "csv"
    if ext in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "jsonl" if text.lstrip().startswith("{") else "csv"


def _read_text(path: str) -> str:
    if not os.path.exists(path):
        raise ReportError(f"no such file: {path}")
    if os.path.isdir(path):
        raise ReportError(f"{path} is a folder, expected a file")
    try:
        with open(path, encoding="utf-8-sig") as f:  # tolerate a byte-order mark
            return f.read()
    except UnicodeDecodeError:
        raise ReportError(f"{path} is not a UTF-8 text file") from None
    except OSError as exc:
        raise ReportError(f"cannot read {path}: {exc.strerror or exc}") from None


def _json_objects(path: str, text: str, required):
    """(line number, object) per non-blank JSONL line, each holding the ``required`` keys."""
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {line_no}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReportError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ReportError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        missing = [k for k in required if k not in rec]
        if missing:
            raise ReportError(f"{where}: missing {', '.join(missing)}")
        yield line_no, rec


def _jsonl_rows(path: str, text: str):
    """(where, record) per non-blank JSONL line."""
    for row, (line_no, rec) in enumerate(_json_objects(path, text, LENGTH_FIELDS), start=1):
        yield f"{path} row {row} (line {line_no})", rec


def _csv_rows(path: str, text: str):
    """(where, record) per CSV data row; the header must name the length columns."""
    reader = csv.DictReader(text.splitlines())
    header = [name.strip() for name in (reader.fieldnames or [])]
    if not header:
        raise ReportError(f"{path} has no rows")
    reader.fieldnames = header
    missing = [name for name in LENGTH_FIELDS if name not in header]
    if missing:
        raise ReportError(f"{path} line 1: CSV header lacks column {', '.join(missing)} "
                          f"(found: {', '.join(header)})")
    row = 0
    for rec in reader:
        if not any((value or "").strip() for value in rec.values() if isinstance(value, str)):
            continue  # blank line
        row += 1
        where = f"{path} row {row} (line {reader.line_num})"
        for name in LENGTH_FIELDS:
            if rec.get(name) is None or not rec[name].strip():
                raise ReportError(f"{where}: empty {name}")
        if rec.get("prompt_id") is not None and not rec["prompt_id"].strip():
            rec = {k: v for k, v in rec.items() if k != "prompt_id"}  # an empty cell means no id
        yield where, rec


def read_lengths(path: str) -> Lengths:
    """Read a JSONL or CSV lengths file (format by extension, else by content)."""
    text = _read_text(path)
    rows = _csv_rows(path, text) if _file_format(path, text) == "csv" else _jsonl_rows(path, text)
    prompt, response, ids, id_rows, first_without = [], [], [], 0, None
    for where, rec in rows:
        prompt.append(_number(rec["prompt_length"], "prompt_length", where))
        response.append(_number(rec["response_length"], "response_length", where))
        if "prompt_id" in rec and rec["prompt_id"] is not None:
            pid = rec["prompt_id"]
            ids.append(pid.strip() if isinstance(pid, str) else json.dumps(pid, sort_keys=True))
            id_rows += 1
        else:
            ids.append(None)
            first_without = first_without or where
        if id_rows and first_without:
            raise ReportError(f"{first_without}: no prompt_id while other rows have one")
    if not prompt:
        raise ReportError(f"{path} has no rows")
    return Lengths(np.array(prompt), np.array(response), ids if id_rows else None, path)


def group_rows(n_rows: int, prompt_ids: Optional[Sequence[str]] = None, n_samples: int = 1,
               group: bool = True, source: str = "input") -> List[np.ndarray]:
    """Row indices per balance unit: a GRPO group (by prompt_id, else
    consecutive ``n_samples`` rows), or single rows when ``group`` is False."""
    if not group:
        return [np.array([i]) for i in range(n_rows)]
    if prompt_ids is not None:
        members: Dict[str, List[int]] = {}
        for i, pid in enumerate(prompt_ids):
            members.setdefault(pid, []).append(i)
        return [np.array(rows) for rows in members.values()]
    if n_samples < 1:
        raise ReportError(f"--n-samples must be >= 1, got {n_samples}")
    if n_rows % n_samples:
        raise ReportError(f"{source}: {n_rows} rows are not a whole number of groups of "
                          f"--n-samples {n_samples} (add prompt_id, or use --no-group)")
    return [np.arange(s, s + n_samples) for s in range(0, n_rows, n_samples)]


# ---------------------------------------------------------------- run input


def _balance_path(path: str) -> str:
    if not os.path.exists(path):
        raise ReportError(f"no such file or folder: {path}")
    if os.path.isdir(path):
        file = os.path.join(path, BALANCE_FILE)
        if not os.path.isfile(file):
            raise ReportError(f"no {BALANCE_FILE} in {path} (a run writes it with "
                              f"rl_config.use_dp_batch_balance=true and an output folder)")
        return file
    return path


def _check_loads(values, name: str, where: str) -> List[float]:
    if not isinstance(values, list) or not values:
        raise ReportError(f"{where}: {name} must be a non-empty list of numbers")
    return [_number(v, name, where) for v in values]


def read_balance_file(path: str) -> List[dict]:
    """Plans of a ``balance.jsonl`` (checked), in file order."""
    text = _read_text(path)
    plans = []
    for line_no, rec in _json_objects(path, text, ()):
        where = f"{path} line {line_no}"
        if "event" in rec and "iteration" not in rec:
            continue  # a marker (e.g. where a resumed run continued), not a plan
        missing = [k for k in ("iteration", "consumer", "loads", "random_loads") if k not in rec]
        if missing:
            raise ReportError(f"{where}: missing {', '.join(missing)}")
        iteration = rec["iteration"]
        if isinstance(iteration, bool) or not isinstance(iteration, int):
            raise ReportError(f"{where}: iteration must be an integer, got {json.dumps(iteration)}")
        loads = _check_loads(rec["loads"], "loads", where)
        random_loads = _check_loads(rec["random_loads"], "random_loads", where)
        if len(random_loads) != len(loads):
            raise ReportError(f"{where}: random_loads has {len(random_loads)} entries but loads has {len(loads)}")
        sizes = rec.get("sizes")
        if sizes is None:
            sizes = [0] * len(loads)
        elif not isinstance(sizes, list) or len(sizes) != len(loads):
            raise ReportError(f"{where}: sizes must be a list of {len(loads)} counts")
        ranks = rec.get("ranks")
        if ranks is not None and (not isinstance(ranks, list) or len(ranks) != len(loads)
                                  or not all(isinstance(r, int) and r >= 0 for r in ranks)):
            raise ReportError(f"{where}: ranks must be a list of {len(loads)} DP ranks (ints >= 0)")
        bound = rec.get("lower_bound")
        if bound is not None:
            bound = _number(bound, "lower_bound", where)
        tools = rec.get("tools")
        if tools is not None:  # a multi-turn rollout round: per engine, seconds on tools and those it stepped
            if not isinstance(tools, dict) or sorted(tools) != ["busy", "running"]:
                raise ReportError(f"{where}: tools must be an object with 'running' and 'busy' (seconds per engine)")
            tools = {k: _check_loads(tools[k], f"tools.{k}", where) for k in ("running", "busy")}
            if any(len(v) != len(loads) for v in tools.values()):
                raise ReportError(f"{where}: tools.running and tools.busy must have {len(loads)} entries, as loads")
        plans.append({"iteration": iteration, "consumer": str(rec["consumer"]),
                      "objective": str(rec.get("objective", "tokens")), "loads": loads,
                      "random_loads": random_loads, "sizes": [int(s) for s in sizes], "ranks": ranks,
                      "balanced": bool(rec.get("balanced", True)), "served": rec.get("served"),
                      "lower_bound": bound, "tools": tools})
    if not plans:
        raise ReportError(f"{path} has no balance plans")
    return plans


def _ranges(values: Sequence[int]) -> str:
    """Compact sorted integers: [1, 2, 3, 7] -> '1-3, 7'."""
    out, items = [], sorted(set(values))
    start = prev = items[0]
    for v in items[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def unbalanced_consumers(plans: List[dict]) -> List[str]:
    """Consumers among ``plans`` (read_balance_file's) that were split at random, not balanced (e.g. actor_rollout)."""
    return list(dict.fromkeys(p["consumer"] for p in plans if not p["balanced"]))


def select_plans(plans: List[dict], iteration: Optional[int] = None, consumer: Optional[str] = None,
                 source: str = BALANCE_FILE) -> List[dict]:
    """Plans (read_balance_file's) of ``consumer`` (default: every consumer; the stages that were not balanced only
    when no stage was) in ``iteration`` (default: the last one present)."""
    if consumer is not None:
        consumers = list(dict.fromkeys(p["consumer"] for p in plans))
        plans = [p for p in plans if p["consumer"] == consumer]
        if not plans:
            raise ReportError(f"no plans for consumer {consumer!r} in {source}; "
                              f"consumers: {', '.join(consumers)}")
    iterations = [p["iteration"] for p in plans]
    if iteration is None:
        iteration = max(iterations)
    chosen = [p for p in plans if p["iteration"] == iteration]
    if not chosen:
        of = f" for consumer {consumer!r}" if consumer is not None else ""
        raise ReportError(f"no plans for iteration {iteration} in {source}{of}; "
                          f"iterations: {_ranges(iterations)}")
    if consumer is None and any(p["balanced"] for p in chosen):
        chosen = [p for p in chosen if p["balanced"]]
    return chosen
