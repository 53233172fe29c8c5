"""DP balance report: per-rank load before (random split) and after (balancer).

Two inputs:

``--lengths FILE``
    Per-sequence lengths, JSONL (one object a line) or CSV, with the fields
    ``prompt_length`` and ``response_length`` and an optional ``prompt_id``.
    Rows sharing a ``prompt_id`` form a GRPO group; without it, consecutive
    ``--n-samples`` rows do. The groups are split over ``--dp-size`` ranks
    twice: "before" is a seeded random split with the same per-rank group
    counts (what the dock does without balance), "after" is
    ``get_seqlen_balanced_partitions``.

``--run DIR_OR_FILE``
    A run folder (its ``balance.jsonl``) or that file. Each line is one
    balance plan of the transfer dock; "before" is its ``random_loads``,
    "after" its ``loads``. ``--iteration`` and ``--consumer`` pick plans
    (default: every plan of the last iteration).

Prints a plain-text table per plan; ``--png`` draws a bar chart, ``--json``
saves the numbers. Bad input prints one line to stderr and exits with 2.

    python -m mindspeed_rl.tools.balance_report --lengths lengths.jsonl --dp-size 4 --n-samples 8
    python -m mindspeed_rl.tools.balance_report --run outputs/grpo --consumer actor_train --png balance.png
"""
import argparse
import csv
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from mindspeed_rl.utils.seqlen_balancing import METHODS, get_seqlen_balanced_partitions, sized_lower_bound
from mindspeed_rl.utils.workload import OBJECTIVES, WorkloadModel, sequence_workloads

PROG = "balance_report"
LENGTH_FIELDS = ("prompt_length", "response_length")
BALANCE_FILE = "balance.jsonl"
DEFAULT_SEED = 1234
DEFAULT_TITLE = "DP batch balance: per-rank load, random split vs balanced"
# model dimensions of the flops objective: option name -> WorkloadModel.from_dims argument
FLOPS_DIMS = {"hidden_size": "hidden_size", "num_layers": "num_layers", "num_heads": "num_attention_heads",
              "ffn_size": "ffn_hidden_size"}
FLOPS_OPTIONAL = {"num_kv_heads": "num_kv_heads", "vocab_size": "vocab_size"}


class ReportError(Exception):
    """A user-facing problem with the input; ``main`` prints it as one line."""


@dataclass
class Lengths:
    """Per-row lengths read from a file; ``prompt_ids`` is None when the file has none."""

    prompt: np.ndarray
    response: np.ndarray
    prompt_ids: Optional[List[str]] = None
    source: str = ""


@dataclass
class PlanReport:
    """Per-share loads of one split: before (random) and after (balanced)."""

    label: str
    before: List[float]
    after: List[float]
    sizes: List[int]
    objective: str = "tokens"
    unit: str = "units"  # what ``sizes`` counts: groups, rows, units
    share: str = "share"  # what one bar is: rank or share
    iteration: Optional[int] = None
    consumer: Optional[str] = None
    lower_bound: Optional[float] = None  # lower bound on the heaviest load, when known
    extra: Dict[str, object] = field(default_factory=dict)

    def summary(self) -> Dict[str, object]:
        before, after = load_stats(self.before), load_stats(self.after)
        return {"before": before, "after": after, "gain": step_time_gain(before["max"], after["max"]),
                "lower_bound": self.lower_bound}

    def to_dict(self) -> Dict[str, object]:
        return {"label": self.label, "iteration": self.iteration, "consumer": self.consumer,
                "objective": self.objective, "unit": self.unit, "share": self.share, "sizes": list(self.sizes),
                "before": list(self.before), "after": list(self.after), "summary": self.summary(), **self.extra}


# ---------------------------------------------------------------- statistics


def load_stats(loads: Sequence[float]) -> Dict[str, float]:
    """max, min, mean and imbalance (max / mean - 1) of per-share loads."""
    arr = np.asarray(loads, dtype=np.float64)
    mean = float(arr.mean())
    top = float(arr.max())
    return {"max": top, "min": float(arr.min()), "mean": mean, "sum": float(arr.sum()),
            "imbalance": top / mean - 1.0 if mean > 0 else 0.0}


def step_time_gain(max_before: float, max_after: float) -> Optional[float]:
    """max_before / max_after: how much shorter the slowest rank's step gets (None if undefined)."""
    if max_after > 0:
        return max_before / max_after
    return 1.0 if max_before == 0 else None


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


def _jsonl_rows(path: str, text: str):
    """(where, record) per non-blank JSONL line."""
    row = 0
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReportError(f"{path} line {line_no}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise ReportError(f"{path} line {line_no}: expected a JSON object, got {type(rec).__name__}")
        row += 1
        missing = [name for name in LENGTH_FIELDS if name not in rec]
        if missing:
            raise ReportError(f"{path} line {line_no}: missing {', '.join(missing)}")
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


def report_from_lengths(lengths: Lengths, dp_size: int, n_samples: int = 1, objective: str = "tokens",
                        model: Optional[WorkloadModel] = None, method: str = "auto", group: bool = True,
                        seed: int = DEFAULT_SEED) -> PlanReport:
    """Split the units of ``lengths`` over ``dp_size`` ranks: random split vs the balancer."""
    if n_samples < 1:
        raise ReportError(f"--n-samples must be >= 1, got {n_samples}")
    units = group_rows(lengths.prompt.size, lengths.prompt_ids, n_samples, group, lengths.source or "input")
    grouped = group and (lengths.prompt_ids is not None or n_samples > 1)
    unit = "groups" if grouped else "rows"
    if dp_size < 1:
        raise ReportError(f"--dp-size must be >= 1, got {dp_size}")
    if dp_size > len(units):
        raise ReportError(f"--dp-size {dp_size} is larger than the number of {unit} ({len(units)})")
    try:
        row_costs = sequence_workloads(lengths.prompt, lengths.response, objective=objective, model=model)
    except ValueError as exc:
        raise ReportError(str(exc)) from None
    costs = np.array([row_costs[rows].sum() for rows in units])
    try:
        parts = get_seqlen_balanced_partitions(costs, dp_size, equal_size=True, method=method)
    except ValueError as exc:
        if method == "heapq" and len(units) % dp_size:
            raise ReportError(f"--method heapq needs the number of {unit} ({len(units)}) divisible by "
                              f"--dp-size {dp_size}; use auto or karmarkar_karp") from None
        raise ReportError(str(exc)) from None
    sizes = [len(p) for p in parts]
    after = [float(costs[p].sum()) for p in parts]
    # random split with the same per-rank counts, as the dock's baseline
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    before = np.add.reduceat(costs[np.random.default_rng(seed).permutation(costs.size)], starts).tolist()
    bound = sized_lower_bound(costs, dp_size, equal_size=True)
    label = f"{os.path.basename(lengths.source) or 'lengths'}: {len(units)} {unit} on {dp_size} ranks"
    return PlanReport(label=label, before=[float(x) for x in before], after=after, sizes=sizes,
                      objective=objective, unit=unit, share="rank", lower_bound=float(bound),
                      extra={"rows": int(lengths.prompt.size), "dp_size": dp_size, "method": method,
                             "seed": seed, "grouped": grouped})


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
        plans.append({"iteration": iteration, "consumer": str(rec["consumer"]),
                      "objective": str(rec.get("objective", "tokens")), "loads": loads,
                      "random_loads": random_loads, "sizes": [int(s) for s in sizes]})
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


def select_plans(plans: List[dict], iteration: Optional[int] = None, consumer: Optional[str] = None,
                 source: str = BALANCE_FILE) -> List[dict]:
    """Plans of ``consumer`` (default: all) in ``iteration`` (default: the last one present)."""
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
    return chosen


def report_from_run(path: str, iteration: Optional[int] = None, consumer: Optional[str] = None) -> List[PlanReport]:
    """One PlanReport per selected plan of a run folder or ``balance.jsonl``."""
    file = _balance_path(path)
    chosen = select_plans(read_balance_file(file), iteration, consumer, file)
    counts: Dict[tuple, int] = {}
    for p in chosen:
        key = (p["iteration"], p["consumer"])
        counts[key] = counts.get(key, 0) + 1
    reports, seen = [], {}
    for p in chosen:
        key = (p["iteration"], p["consumer"])
        seen[key] = seen.get(key, 0) + 1
        label = f"iteration {p['iteration']}, {p['consumer']}"
        if counts[key] > 1:
            label += f" #{seen[key]}"
        reports.append(PlanReport(label=label, before=p["random_loads"], after=p["loads"], sizes=p["sizes"],
                                  objective=p["objective"], unit="units", share="share",
                                  iteration=p["iteration"], consumer=p["consumer"]))
    return reports


# ---------------------------------------------------------------- output


def _fmt(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _short(x: float, top: float) -> str:
    """Compact bar label: 56.1k, 2.35M."""
    if top >= 1e6:
        return f"{x / 1e6:.2f}M"
    if top >= 1e4:
        return f"{x / 1e3:.1f}k"
    return _fmt(x)


def _gain_text(gain: Optional[float]) -> str:
    return "n/a" if gain is None else f"{gain:.3f}x"


def format_table(report: PlanReport) -> str:
    """Plain-text table of one plan: per share, then max/min/mean/imbalance."""
    s = report.summary()
    b, a = s["before"], s["after"]
    rows = [(f"{report.share} {i}", str(n) if n else "-", _fmt(x), _fmt(y))
            for i, (n, x, y) in enumerate(zip(report.sizes, report.before, report.after))]
    rows += [("max", "", _fmt(b["max"]), _fmt(a["max"])),
             ("min", "", _fmt(b["min"]), _fmt(a["min"])),
             ("mean", "", _fmt(b["mean"]), _fmt(a["mean"])),
             ("imbalance", "", f"{b['imbalance']:.2%}", f"{a['imbalance']:.2%}")]
    head = ("", report.unit, "before (random)", "after (balanced)")
    widths = [max(len(r[c]) for r in rows + [head]) for c in range(4)]
    line = lambda r: f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"  # noqa: E731
    out = [f"{report.label} ({report.objective})", line(head), "-" * len(line(head))]
    out += [line(r) for r in rows[:-4]] + ["-" * len(line(head))] + [line(r) for r in rows[-4:]]
    out.append(f"step-time gain (max before / max after): {_gain_text(s['gain'])}")
    if report.lower_bound is not None:
        gap = a["max"] / report.lower_bound - 1.0 if report.lower_bound > 0 else 0.0
        out.append(f"lower bound on the max load: {_fmt(report.lower_bound)} (after is {gap:.2%} above it)")
    return "\n".join(out)


def _load_label(objective: str) -> str:
    return "tokens" if objective == "tokens" else "FLOPs (in per-token units)"


def plot_reports(reports: Sequence[PlanReport], path: str, title: Optional[str] = None,
                 width_px: int = 800, dpi: int = 100, font_scale: float = 1.0) -> str:
    """Bar chart, one panel per plan: load per share before vs after, a dashed
    line at the mean, the imbalance numbers in the panel title. ``font_scale``
    enlarges all text (for images shown scaled down). Returns ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg, no display needed
    from matplotlib.figure import Figure

    if not reports:
        raise ReportError("nothing to plot")
    width = width_px / dpi
    fs = lambda size: size * font_scale  # noqa: E731
    fig = Figure(figsize=(width, 0.6 * font_scale + 3.4 * len(reports) * max(1.0, font_scale ** 0.5)), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(reports), 1, squeeze=False)[:, 0]
    for ax, rep in zip(axes, reports):
        s = rep.summary()
        x = np.arange(len(rep.after))
        bar_w = 0.38
        bars_b = ax.bar(x - bar_w / 2, rep.before, bar_w, color="#c9a227", label="before: random split")
        bars_a = ax.bar(x + bar_w / 2, rep.after, bar_w, color="#2f6db5", label="after: balanced")
        ax.axhline(s["after"]["mean"], color="#333333", linestyle="--", linewidth=1.2,
                   label=f"mean {_fmt(s['after']['mean'])}")
        top = max(s["before"]["max"], s["after"]["max"])
        if len(x) <= 12:  # value labels stay readable for a few bars
            for bars in (bars_b, bars_a):
                labels = [_short(v, top) for v in bars.datavalues]
                for text in ax.bar_label(bars, labels=labels, fontsize=fs(8 if len(x) <= 6 else 7), padding=2):
                    text.set_bbox({"facecolor": "white", "edgecolor": "none", "pad": 0.6, "alpha": 0.85})
        ax.set_ylim(0, top * 1.22 if top > 0 else 1)
        ax.set_xticks(x, [f"{rep.share} {i}" for i in x])
        ax.set_ylabel(f"load ({_load_label(rep.objective)})", fontsize=fs(10))
        ax.set_title(f"{rep.label}\nimbalance {s['before']['imbalance']:.2%} → {s['after']['imbalance']:.2%}, "
                     f"step-time gain {_gain_text(s['gain'])}", fontsize=fs(10))
        ax.legend(loc="upper right", fontsize=fs(8), ncol=3, frameon=False)
        ax.tick_params(labelsize=fs(9))
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    fig.suptitle(title or DEFAULT_TITLE, fontsize=fs(12), fontweight="bold")
    fig.tight_layout()
    _ensure_parent(path)
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def write_json(reports: Sequence[PlanReport], path: str, source: str, mode: str) -> str:
    data = {"source": source, "mode": mode, "plans": [r.to_dict() for r in reports]}
    _ensure_parent(path)
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path


def _ensure_parent(path: str):
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"cannot create folder {parent}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    """argparse that raises ReportError instead of printing usage and exiting."""

    def error(self, message):
        raise ReportError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Per-rank DP load before (random split) and after balancing.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--lengths", metavar="FILE", help="JSONL or CSV with prompt_length, response_length "
                                                        "[, prompt_id]")
    src.add_argument("--run", metavar="DIR_OR_FILE", help="run folder (its balance.jsonl) or a balance.jsonl")
    g = p.add_argument_group("--lengths options")
    g.add_argument("--dp-size", type=int, help="number of data-parallel ranks (required with --lengths)")
    g.add_argument("--n-samples", type=int, default=1, help="rows per GRPO group when there is no prompt_id")
    g.add_argument("--objective", choices=OBJECTIVES, default="tokens")
    g.add_argument("--method", choices=METHODS, default="auto", help="balancer method (default auto)")
    g.add_argument("--group", action=argparse.BooleanOptionalAction, default=True,
                   help="keep a GRPO group on one rank (default: yes)")
    g.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the random 'before' split")
    m = p.add_argument_group("model dimensions (--objective flops)")
    for name in list(FLOPS_DIMS) + list(FLOPS_OPTIONAL):
        m.add_argument("--" + name.replace("_", "-"), type=int, dest=name)
    r = p.add_argument_group("--run options")
    r.add_argument("--iteration", type=int, help="iteration to report (default: the last)")
    r.add_argument("--consumer", help="consumer to report, e.g. actor_train (default: all)")
    o = p.add_argument_group("output")
    o.add_argument("--png", metavar="PATH", help="write a bar chart")
    o.add_argument("--json", metavar="PATH", help="write the numbers as JSON")
    o.add_argument("--title", help="chart title")
    return p


def _workload_model(args) -> Optional[WorkloadModel]:
    if args.objective != "flops":
        return None
    missing = ["--" + n.replace("_", "-") for n in FLOPS_DIMS if getattr(args, n) is None]
    if missing:
        raise ReportError(f"--objective flops needs {', '.join(missing)}")
    dims = {FLOPS_DIMS[n]: getattr(args, n) for n in FLOPS_DIMS}
    dims.update({FLOPS_OPTIONAL[n]: getattr(args, n) for n in FLOPS_OPTIONAL if getattr(args, n) is not None})
    try:
        return WorkloadModel.from_dims(**dims)
    except ValueError as exc:
        raise ReportError(str(exc)) from None


def _reports(args) -> List[PlanReport]:
    if args.lengths is not None:
        for opt in ("iteration", "consumer"):
            if getattr(args, opt) is not None:
                raise ReportError(f"--{opt} applies to --run only")
        if args.dp_size is None:
            raise ReportError("--lengths needs --dp-size")
        if args.dp_size < 1:
            raise ReportError(f"--dp-size must be >= 1, got {args.dp_size}")
        if args.n_samples < 1:
            raise ReportError(f"--n-samples must be >= 1, got {args.n_samples}")
        model = _workload_model(args)
        lengths = read_lengths(args.lengths)
        return [report_from_lengths(lengths, args.dp_size, args.n_samples, args.objective, model,
                                    args.method, args.group, args.seed)]
    if args.dp_size is not None:
        raise ReportError("--dp-size applies to --lengths only (a run's plans fix the shares)")
    return report_from_run(args.run, args.iteration, args.consumer)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the exit code (0 ok, 2 bad input)."""
    try:
        args = build_parser().parse_args(argv)
        reports = _reports(args)
        print("\n\n".join(format_table(r) for r in reports))
        if args.png:
            plot_reports(reports, args.png, args.title)
            print(f"chart: {args.png}")
        if args.json:
            write_json(reports, args.json, args.lengths or args.run, "lengths" if args.lengths else "run")
            print(f"numbers: {args.json}")
    except ReportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
