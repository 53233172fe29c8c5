"""Learning with and without partial rollout: the learning test's run (toy 'length' task, tiny Qwen2, DP=2, 60
iterations, GRPO) as is, and with rl_config.partial_rollout_max_split=2 and its default rollout correction
(token-level IS weights truncated at 2). Prints the reward curve of both (mean over windows of 5 iterations),
the rollout correction's metrics of the partial run, and a TARGETS block: the partial run's last-5 reward > 0.8
and > 0.25 above its first-5 (the learning test's thresholds); exits 1 when a target fails.

Usage: python benchmarks/bench_partial_learning.py [--iters 60] [--out benchmarks/results/bench_partial_learning.md]
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.train_grpo import run  # noqa: E402

CONFIG = ROOT / "configs" / "grpo_tiny_cpu.yaml"
BASE = ["megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8", "rl_config.mini_batch_size=8",
        "rl_config.init_kl_coef=0.0", "rl_config.seed=7", "megatron_training.use_distributed_optimizer=false"]
RUNS = {"plain": [], "partial N=2 + correction": ["rl_config.partial_rollout_max_split=2"]}
CORR = ("rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_max", "rollout_corr/rollout_is_min",
        "rollout_corr/rollout_is_ratio_fraction_high", "partial_rollout/token_age_mean",
        "partial_rollout/continued_rows", "partial_rollout/passes", "actor/rollout_log_prob_k3_kl")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--out", default=None, help="also write the tables to this markdown file")
    args = ap.parse_args()
    curves, histories = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in RUNS.items():
            history = run(str(CONFIG), BASE + extra + [f"megatron_training.train_iters={args.iters}"],
                          os.path.join(tmp, name.split()[0]), os.path.join(tmp, "tiny_model"))
            histories[name] = history
            curves[name] = np.array([m["reward/mean"] for m in history])
    lines = ["| iterations | " + " | ".join(RUNS) + " |", "|---|" + "---:|" * len(RUNS)]
    for start in range(0, args.iters, 5):
        cells = [f"{curves[n][start:start + 5].mean():.3f}" for n in RUNS]
        lines.append(f"| {start + 1}-{min(start + 5, args.iters)} | " + " | ".join(cells) + " |")
    partial = histories["partial N=2 + correction"]
    lines += ["", "| metric (partial run) | mean | max |", "|---|---:|---:|"]
    for key in CORR:
        values = [m[key] for m in partial if key in m]
        if values:
            lines.append(f"| {key} | {np.mean(values):.4f} | {np.max(values):.4f} |")
    curve = curves["partial N=2 + correction"]
    first, last = curve[:5].mean(), curve[-5:].mean()
    ok_level, ok_rise = last > 0.8, last - first > 0.25
    lines += ["", "TARGETS", f"- partial last-5 reward {last:.3f} > 0.8: {'PASS' if ok_level else 'FAIL'}",
              f"- partial rise {last - first:.3f} > 0.25: {'PASS' if ok_rise else 'FAIL'}",
              f"- (plain: first-5 {curves['plain'][:5].mean():.3f}, last-5 {curves['plain'][-5:].mean():.3f})"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text("# Learning with and without partial rollout\n\n"
                                  "`python benchmarks/bench_partial_learning.py`\n\n" + text + "\n")
    return 0 if ok_level and ok_rise else 1


if __name__ == "__main__":
    sys.exit(main())
