"""Output of the DP balance report: per-plan loads, statistics, table, chart and JSON."""
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from mindspeed_rl.reports.report_inputs import ReportError
from mindspeed_rl.utils.metrics import imbalance

DEFAULT_TITLE = "DP batch balance: per-rank load, random split vs balanced"


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
    balanced: bool = True  # False: 'after' is a split served without balance (e.g. actor_rollout, rollout_balance static)
    served: Optional[str] = None  # 'queue': the rollout queue's measured busy seconds, before = the static split replayed
    extra: Dict[str, object] = field(default_factory=dict)

    def summary(self) -> Dict[str, object]:
        before, after = load_stats(self.before), load_stats(self.after)
        return {"before": before, "after": after, "gain": step_time_gain(before["max"], after["max"]),
                "lower_bound": self.lower_bound}

    @property
    def columns(self):
        """(before, after) as the table and the chart name them."""
        if self.served == "queue":
            return "static split (replayed)", "queue (measured)"
        return "before (random)", "after (balanced)" if self.balanced else "served (not balanced)"

    def to_dict(self) -> Dict[str, object]:
        return {"label": self.label, "iteration": self.iteration, "consumer": self.consumer,
                "objective": self.objective, "unit": self.unit, "share": self.share, "sizes": list(self.sizes),
                "balanced": self.balanced, "served": self.served,
                "before": list(self.before), "after": list(self.after), "summary": self.summary(), **self.extra}


# ---------------------------------------------------------------- statistics


def load_stats(loads: Sequence[float]) -> Dict[str, float]:
    """max, min, mean and imbalance (max / mean - 1, metrics.imbalance) of per-share loads."""
    arr = np.asarray(loads, dtype=np.float64)
    return {"max": float(arr.max()), "min": float(arr.min()), "mean": float(arr.mean()), "sum": float(arr.sum()),
            "imbalance": imbalance(arr)}


def step_time_gain(max_before: float, max_after: float) -> Optional[float]:
    """max_before / max_after: how much shorter the slowest rank's step gets (None if undefined)."""
    if max_after > 0:
        return max_before / max_after
    return 1.0 if max_before == 0 else None


# ---------------------------------------------------------------- output


def _fmt(x: float, objective: str = "tokens") -> str:
    if objective == "seconds":
        return f"{x:.3f}"
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
    o = report.objective
    rows = [(f"{report.share} {i}", str(n) if n else "-", _fmt(x, o), _fmt(y, o))
            for i, (n, x, y) in enumerate(zip(report.sizes, report.before, report.after))]
    rows += [("max", "", _fmt(b["max"], o), _fmt(a["max"], o)),
             ("min", "", _fmt(b["min"], o), _fmt(a["min"], o)),
             ("mean", "", _fmt(b["mean"], o), _fmt(a["mean"], o)),
             ("imbalance", "", f"{b['imbalance']:.2%}", f"{a['imbalance']:.2%}")]
    head = ("", report.unit, *report.columns)
    widths = [max(len(r[c]) for r in rows + [head]) for c in range(4)]
    line = lambda r: f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"  # noqa: E731
    out = [f"{report.label} ({report.objective})", line(head), "-" * len(line(head))]
    out += [line(r) for r in rows[:-4]] + ["-" * len(line(head))] + [line(r) for r in rows[-4:]]
    out.append(f"step-time gain (max before / max after): {_gain_text(s['gain'])}")
    if report.lower_bound is not None:
        gap = a["max"] / report.lower_bound - 1.0 if report.lower_bound > 0 else 0.0
        out.append(f"lower bound on the max load: {_fmt(report.lower_bound)} (after is {gap:.2%} above it)")
    tools = report.extra.get("tools")
    if tools:
        out.append(tool_line(tools["running"], tools["busy"], report.after))
    return "\n".join(out)


def tool_line(running: Sequence[float], busy: Sequence[float], stage: Sequence[float]) -> str:
    """A multi-turn round's tool figures: per engine, the share of the seconds its rows waited on tools during
    which it stepped other rows, and the tools' share of its serve seconds."""
    per = [f"{b / r:.0%}" if r > 0 else "-" for r, b in zip(running, busy)]
    total = sum(running)
    pooled = f"{sum(busy) / total:.1%}" if total > 0 else "-"
    share = f"{total / sum(stage):.1%}" if sum(stage) > 0 else "-"
    return (f"while tools ran: engines busy {pooled} ({' / '.join(per)} per engine); tool time {share} of the "
            f"engines' serve seconds (not replayed: the step cost knows no tool time)")


def _load_label(objective: str) -> str:
    return {"tokens": "tokens", "seconds": "busy seconds"}.get(objective, "FLOPs (in per-token units)")


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
        before, after = rep.columns
        bars_b = ax.bar(x - bar_w / 2, rep.before, bar_w, color="#c9a227", label=before)
        bars_a = ax.bar(x + bar_w / 2, rep.after, bar_w, color="#2f6db5", label=after)
        ax.axhline(s["after"]["mean"], color="#333333", linestyle="--", linewidth=1.2,
                   label=f"mean {_fmt(s['after']['mean'], rep.objective)}")
        top = max(s["before"]["max"], s["after"]["max"])
        if len(x) <= 12:  # value labels stay readable for a few bars
            for bars in (bars_b, bars_a):
                labels = [_fmt(v, "seconds") if rep.objective == "seconds" else _short(v, top)
                          for v in bars.datavalues]
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

