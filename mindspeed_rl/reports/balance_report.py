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
    "after" its ``loads``, per DP rank when the plan names its ranks (the
    same numbers as the console's ``imb``/``random``). ``--iteration`` and
    ``--consumer`` pick plans (default: every balanced plan of the last
    iteration; a stage that is not balanced, such as actor_rollout, only with
    ``--consumer``, its column then reads "served (not balanced)").

Prints a plain-text table per plan; ``--png`` draws a bar chart, ``--json``
saves the numbers. Bad input prints one line to stderr and exits with 2.

    python -m mindspeed_rl.reports.balance_report --lengths lengths.jsonl --dp-size 4 --n-samples 8
    python -m mindspeed_rl.reports.balance_report --run outputs/grpo --consumer actor_train --png balance.png
"""
import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from mindspeed_rl.reports.report_inputs import (  # noqa: F401  (re-exported)
    BALANCE_FILE, LENGTH_FIELDS, Lengths, ReportError, group_rows, read_balance_file, read_lengths, select_plans,
    unbalanced_consumers, _balance_path)
from mindspeed_rl.reports.report_output import (  # noqa: F401  (re-exported)
    DEFAULT_TITLE, PlanReport, format_table, load_stats, plot_reports, step_time_gain, write_json)
from mindspeed_rl.utils.metrics import plan_loads
from mindspeed_rl.balance.seqlen_balancing import METHODS, get_seqlen_balanced_partitions, sized_lower_bound
from mindspeed_rl.balance.workload import OBJECTIVES, WorkloadModel, sequence_workloads

PROG = "balance_report"
DEFAULT_SEED = 1234
# model dimensions of the flops objective: option name -> WorkloadModel.from_dims argument
FLOPS_DIMS = {"hidden_size": "hidden_size", "num_layers": "num_layers", "num_heads": "num_attention_heads",
              "ffn_size": "ffn_hidden_size"}
FLOPS_OPTIONAL = {"num_kv_heads": "num_kv_heads", "vocab_size": "vocab_size"}


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


def report_from_run(path: str, iteration: Optional[int] = None, consumer: Optional[str] = None,
                    notes: Optional[List[str]] = None) -> List[PlanReport]:
    """One PlanReport per selected plan of a run folder or ``balance.jsonl``; a line on the
    stages left out goes to ``notes``."""
    file = _balance_path(path)
    plans = read_balance_file(file)
    chosen = select_plans(plans, iteration, consumer, file)
    left = [c for c in unbalanced_consumers([p for p in plans if p["iteration"] == chosen[0]["iteration"]])
            if c not in {p["consumer"] for p in chosen}]
    if left and consumer is None and notes is not None:
        notes.append(f"not balanced, left out: {', '.join(left)} (--consumer NAME shows one)")
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
        # shares bound to DP ranks: one bar per rank (its shares summed), as the console's numbers
        sizes = [int(s) for s in plan_loads(p, "sizes")]
        queued = p.get("served") == "queue"  # the rollout queue: busy seconds per engine, the static split replayed
        extra = {"tools": p["tools"]} if queued and isinstance(p.get("tools"), dict) else {}
        bound = p.get("lower_bound") if queued else None
        reports.append(PlanReport(label=label, before=plan_loads(p, "random_loads"), after=plan_loads(p, "loads"),
                                  sizes=sizes, objective=p["objective"], unit="rows" if queued else "units",
                                  share="engine" if queued else "rank" if p.get("ranks") else "share",
                                  iteration=p["iteration"], consumer=p["consumer"], balanced=p["balanced"],
                                  served=p.get("served"), extra=extra,
                                  lower_bound=float(bound) if isinstance(bound, (int, float)) else None))
    return reports


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


def _reports(args, notes: List[str]) -> List[PlanReport]:
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
    return report_from_run(args.run, args.iteration, args.consumer, notes)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point; returns the exit code (0 ok, 2 bad input)."""
    try:
        args = build_parser().parse_args(argv)
        notes: List[str] = []
        reports = _reports(args, notes)
        print("\n\n".join(format_table(r) for r in reports))
        for note in notes:
            print(note)
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
