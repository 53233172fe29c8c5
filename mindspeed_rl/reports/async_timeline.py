"""Timeline of an async run: when each rollout engine and the trainer were busy.

An async run (``rl_config.trainer_mode`` colocate_async or separate_async) writes ``timeline.jsonl`` beside its
``metrics.jsonl``: one line per span, ``{"iteration", "lane", "start", "end", "what"}`` in wall-clock seconds.
Lanes: ``engine k`` (a batch, or a partial rollout pass, from the engine's start to its end) and ``trainer``
(``wait``: waiting for rows; ``train k``: the stages of iteration k after its rows arrived; ``sync vK``: gathering
weights version K). Engines' clocks are their machines' (one machine: one clock).

Prints each lane's busy fraction over the iterations chosen; ``--png`` draws the lanes. Bad input is one line
on stderr and exit code 2.

    python -m mindspeed_rl.reports.async_timeline --run outputs/grpo --png timeline.png
    python -m mindspeed_rl.reports.async_timeline --run outputs/grpo --iterations 3-8
"""
import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from mindspeed_rl.reports.report_inputs import ReportError, _json_objects, _read_text
from mindspeed_rl.utils.loggers import TIMELINE_FILE

PROG = "python -m mindspeed_rl.reports.async_timeline"


def read_timeline(path: str) -> List[dict]:
    """The spans of a run folder's (or a file's) timeline, checked: one line naming the file and line."""
    if os.path.isdir(path):
        path = os.path.join(path, TIMELINE_FILE)
    if not os.path.isfile(path):
        raise ReportError(f"{path}: no such file (only the async trainer modes write a timeline)")
    spans = []
    for line_no, rec in _json_objects(path, _read_text(path), ()):
        where = f"{path} line {line_no}"
        if "event" in rec and "iteration" not in rec:
            continue  # a resume marker
        missing = [k for k in ("iteration", "lane", "start", "end") if k not in rec]
        if missing:
            raise ReportError(f"{where}: missing {', '.join(missing)}")
        if not isinstance(rec["lane"], str):
            raise ReportError(f"{where}: lane must be a string")
        if any(isinstance(rec[k], bool) or not isinstance(rec[k], (int, float)) for k in ("start", "end")):
            raise ReportError(f"{where}: start and end must be numbers (seconds)")
        if rec["end"] < rec["start"]:
            raise ReportError(f"{where}: ends ({rec['end']}) before it starts ({rec['start']})")
        spans.append(rec)
    if not spans:
        raise ReportError(f"{path}: holds no spans")
    return spans


def pick(spans: List[dict], iterations: Optional[Tuple[int, int]]) -> List[dict]:
    if iterations is None:
        return spans
    first, last = iterations
    chosen = [s for s in spans if first <= s["iteration"] <= last]
    if not chosen:
        raise ReportError(f"no spans in iterations {first}-{last} (the timeline holds "
                          f"{min(s['iteration'] for s in spans)}-{max(s['iteration'] for s in spans)})")
    return chosen


def lanes(spans: List[dict]) -> Dict[str, List[dict]]:
    """Spans by lane: the trainer first, then the engines by number."""
    out: Dict[str, List[dict]] = {}
    for s in spans:
        out.setdefault(s["lane"], []).append(s)

    def order(name):
        head, _, tail = name.partition(" ")
        return (head != "trainer", head, int(tail) if tail.isdigit() else 0, name)
    return {k: out[k] for k in sorted(out, key=order)}


def busy_fractions(spans: List[dict]) -> Tuple[float, Dict[str, float]]:
    """(the window's seconds, each lane's busy fraction of it; the trainer's waits are not busy). Overlapping spans
    of one lane count once."""
    start = min(s["start"] for s in spans)
    window = max(s["end"] for s in spans) - start
    out = {}
    for lane, mine in lanes(spans).items():
        work = sorted((s["start"], s["end"]) for s in mine if s.get("what") != "wait")
        busy, reach = 0.0, start
        for a, b in work:
            a = max(a, reach)
            if b > a:
                busy += b - a
                reach = b
        out[lane] = busy / window if window > 0 else 0.0
    return window, out


def format_table(spans: List[dict]) -> str:
    window, fractions = busy_fractions(spans)
    first, last = min(s["iteration"] for s in spans), max(s["iteration"] for s in spans)
    lines = [f"iterations {first}-{last}: {window:.3f} s", "| lane | spans | busy | idle |", "|---|---|---|---|"]
    by_lane = lanes(spans)
    for lane, share in fractions.items():
        work = [s for s in by_lane[lane] if s.get("what") != "wait"]
        lines.append(f"| {lane} | {len(work)} | {share:.1%} | {1 - share:.1%} |")
    return "\n".join(lines)


def plot(spans: List[dict], path: str, title: Optional[str] = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    origin = min(s["start"] for s in spans)
    by_lane = lanes(spans)
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(by_lane)))
    colours = {"wait": "#d0d0d0", "sync": "#e8a33d", "train": "#3b75af"}
    for row, (lane, mine) in enumerate(reversed(list(by_lane.items()))):
        for s in mine:
            kind = str(s.get("what", "")).split(" ")[0]
            colour = colours.get(kind, "#5aa469")
            ax.broken_barh([(s["start"] - origin, s["end"] - s["start"])], (row - 0.4, 0.8), facecolors=colour)
        ax.text(-0.01, row, lane, ha="right", va="center", transform=ax.get_yaxis_transform())
    ax.set_yticks([])
    ax.set_xlabel("seconds from the first span")
    ax.set_title(title or "async timeline: engines (green) and trainer (train blue, sync orange, wait grey)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ReportError(message)


def _iterations(text: Optional[str]) -> Optional[Tuple[int, int]]:
    if text is None:
        return None
    head, _, tail = text.partition("-")
    try:
        first, last = int(head), int(tail or head)
    except ValueError:
        raise ReportError(f"--iterations {text!r}: give N or FIRST-LAST") from None
    if first > last or first < 1:
        raise ReportError(f"--iterations {text!r}: FIRST must be >= 1 and <= LAST")
    return first, last


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _Parser(prog=PROG, description="When each rollout engine and the trainer of an async run were busy.")
    parser.add_argument("--run", required=True, metavar="DIR_OR_FILE", help="run folder (its timeline.jsonl) or the file")
    parser.add_argument("--iterations", metavar="N|FIRST-LAST", help="iterations to show (default: all)")
    parser.add_argument("--png", metavar="PATH", help="draw the lanes")
    parser.add_argument("--title")
    try:
        args = parser.parse_args(argv)
        spans = pick(read_timeline(args.run), _iterations(args.iterations))
        print(format_table(spans))
        if args.png:
            plot(spans, args.png, args.title)
            print(f"chart: {args.png}")
    except ReportError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
