"""The toy tool task learns (multi-turn rollouts with tools, tiny Qwen2, DP=2, GRPO, the learning test's run):
the row's label is known only to the 'secret' tool, so a model that never calls it scores at most 0.25 on average
and one that calls it but answers at random at most 0.325 (verifier tool_match). Runs the task without and, with
--partial, also with rl_config.partial_rollout_max_split=2; prints per window of 5 iterations the reward, the
tool-call rate, tool calls and turns per row and the tool token fraction, and a TARGETS block: each run's last-5
reward > 0.4 (past both caps) and tool-call rate > 0.9, its first-5 reward < 0.2; exits 1 when a target fails.

Usage: python benchmarks/bench_tool_learning.py [--iters 60] [--partial] [--out FILE.md]
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "st")]

from cli.train_grpo import run  # noqa: E402
from tool_task_cases import LEARNING, TASK as TOOL_TASK  # noqa: E402

CONFIG = ROOT / "configs" / "grpo_tiny_cpu.yaml"
TASK = TOOL_TASK + LEARNING
COLUMNS = (("reward", "reward/mean"), ("tool-call rate", "multi_turn/tool_call_rate"),
           ("tool calls / row", "multi_turn/tool_calls_per_row"), ("turns / row", "multi_turn/turns_per_row"),
           ("tool token fraction", "multi_turn/tool_token_fraction"))
WINDOW = 5


def table(history) -> list:
    lines = ["| iterations | " + " | ".join(name for name, _ in COLUMNS) + " |",
             "|---|" + "---|" * len(COLUMNS)]
    for start in range(0, len(history), WINDOW):
        part = history[start:start + WINDOW]
        cells = [f"{np.mean([m[key] for m in part]):.3f}" for _, key in COLUMNS]
        lines.append(f"| {start + 1}-{start + len(part)} | " + " | ".join(cells) + " |")
    return lines


def targets(name, history) -> list:
    reward = np.array([m["reward/mean"] for m in history])
    rate = np.array([m["multi_turn/tool_call_rate"] for m in history])
    return [(f"{name}: reward", reward[-WINDOW:].mean() > 0.4 and reward[:WINDOW].mean() < 0.2,
             f"first-5 {reward[:WINDOW].mean():.3f} (< 0.2), last-5 {reward[-WINDOW:].mean():.3f} (> 0.4: past "
             f"the caps 0.25 without the tool and 0.325 with it read at random)"),
            (f"{name}: tool-call rate", rate[-WINDOW:].mean() > 0.9,
             f"first-5 {rate[:WINDOW].mean():.3f}, last-5 {rate[-WINDOW:].mean():.3f} (> 0.9)")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--partial", action="store_true", help="also run with partial_rollout_max_split=2")
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = ap.parse_args()
    if args.iters < 2 * WINDOW:
        ap.error(f"--iters must be >= {2 * WINDOW}, got {args.iters}")
    runs = {"multi-turn": []}
    if args.partial:
        runs["multi-turn + partial N=2"] = ["rl_config.partial_rollout_max_split=2"]
    text, judged = ["# The toy tool task learns to call its tool (tiny Qwen2, DP=2, GRPO, CPU)", ""], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, extra) in enumerate(runs.items()):
            history = run(str(CONFIG), TASK + extra + [f"megatron_training.train_iters={args.iters}"],
                          os.path.join(tmp, f"run{i}"), os.path.join(tmp, "tiny_model"))
            text += [f"## {name} ({args.iters} iterations; means over windows of {WINDOW})", "", *table(history), ""]
            judged += targets(name, history)
    text += ["## Targets", "", "| target | status | detail |", "|---|---|---|"]
    text += [f"| {n} | {'PASS' if ok else 'FAIL'} | {d} |" for n, ok, d in judged]
    out = "\n".join(text) + "\n"
    print(out)
    if args.out:
        Path(args.out).write_text(out)
    print("== TARGETS ==")
    for n, ok, d in judged:
        print(f"{n:32s}: {'PASS' if ok else 'FAIL'}  {d}")
    failed = [n for n, ok, _ in judged if not ok]
    if failed:
        print(f"targets FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
