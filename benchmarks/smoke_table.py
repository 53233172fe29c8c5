"""Print tokens/s per stage and peak memory from a run's metrics.jsonl (benchmarks/gpu_smoke.sh).

    python benchmarks/smoke_table.py RUN_DIR/metrics.jsonl
Iteration 1 (warm-up) is left out when there are more; medians over the rest.
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mindspeed_rl.plan.stages import STAGES as _STAGES  # noqa: E402

STAGES = tuple(s.name for s in _STAGES if s.kind == "dp")  # the metrics' stage names


def main(path: str) -> int:
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    rows = [r for r in rows if "iteration" in r]  # resume markers carry no iteration
    if not rows:
        print(f"error: {path} holds no iterations", file=sys.stderr)
        return 2
    rows = rows[1:] if len(rows) > 1 else rows
    print(f"{'stage':16s}{'tokens/s (median)':>20s}{'slowest rank s':>16s}{'peak GB':>10s}")
    for stage in STAGES:
        times = [r[f"timing/{stage}/max"] for r in rows if f"timing/{stage}/max" in r]
        if not times:
            continue
        tokens = [sum(v for k, v in r.items() if k.startswith(f"tokens/{stage}/rank")) for r in rows]
        speed = statistics.median(t / s for t, s in zip(tokens, times) if s > 0)
        peak = max((r.get(f"memory/{stage}_peak_gb/max", float("nan")) for r in rows), default=float("nan"))
        print(f"{stage:16s}{speed:20.1f}{statistics.median(times):16.3f}{peak:10.2f}")
    print(f"iteration s (median): {statistics.median(r['timing/iteration'] for r in rows):.3f}; "
          f"reward first {rows[0].get('reward/mean', float('nan')):.3f} last {rows[-1].get('reward/mean', float('nan')):.3f}")
    drift = [r["actor/rollout_log_prob_abs_diff"] for r in rows if "actor/rollout_log_prob_abs_diff" in r]
    if drift:  # vLLM rollout: how far its log-probs are from the trainer's
        print(f"rollout vs trainer log-prob |diff| (median): {statistics.median(drift):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
