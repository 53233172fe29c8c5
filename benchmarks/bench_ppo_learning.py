"""PPO vs GRPO learning curves on the toy length task (CPU, tiny Qwen2, DP=2; PPO's critic DP=2).

Both run the same prompts, shapes, rollout and actor optimizer (configs/ppo_tiny_cpu.yaml and
configs/grpo_tiny_cpu.yaml, 16 prompts x 8 samples, 2 optimizer steps per iteration, no KL); PPO
learns from GAE over its critic's values, GRPO from group-normalised rewards. The table gives the
mean reward of each window of iterations, median over seeds with the min-max spread; the script exits
1 when either algorithm's median last-5 reward is below --target (0.8: ignoring the prompt scores at
most 0.75). --plot writes a PNG of the curves.

    python benchmarks/bench_ppo_learning.py [--iters 60] [--seeds 7 8] [--target 0.8] [--plot FILE] [--quick]
"""
import argparse
import contextlib
import io
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIGS = {"PPO": os.path.join(ROOT, "configs", "ppo_tiny_cpu.yaml"),
           "GRPO": os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")}


def curve(algo: str, iters: int, seed: int, model_dir: str) -> np.ndarray:
    from cli.train_grpo import run
    overrides = ["megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8",
                 "rl_config.mini_batch_size=8", f"megatron_training.train_iters={iters}", f"rl_config.seed={seed}",
                 "rl_config.init_kl_coef=0.0"]
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(io.StringIO()):
        history = run(CONFIGS[algo], overrides, out, model_dir)
    return np.array([m["reward/mean"] for m in history])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 8])
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--plot", default=None, help="PNG file for the curves")
    parser.add_argument("--quick", action="store_true", help="one seed, 10 iterations (checks the script runs)")
    args = parser.parse_args(argv)
    if args.quick:
        args.iters, args.seeds, args.window, args.target = 10, args.seeds[:1], 5, 0.0
    curves = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "model")  # one tiny model for both algorithms and every seed
        for algo in CONFIGS:
            curves[algo] = np.stack([curve(algo, args.iters, seed, model_dir) for seed in args.seeds])
    windows = [(a, min(a + args.window, args.iters)) for a in range(0, args.iters, args.window)]
    print(f"mean reward per window, median over seeds {args.seeds} (min-max)")
    print("| iterations | " + " | ".join(curves) + " |")
    print("| --- | " + " | ".join("---" for _ in curves) + " |")
    for a, b in windows:
        cells = []
        for runs in curves.values():
            means = runs[:, a:b].mean(axis=1)
            cells.append(f"{np.median(means):.3f} ({means.min():.3f}-{means.max():.3f})")
        print(f"| {a + 1}-{b} | " + " | ".join(cells) + " |")
    ok = True
    for algo, runs in curves.items():
        first, last = runs[:, :5].mean(axis=1), runs[:, -5:].mean(axis=1)
        hit = np.median(last) >= args.target
        ok = ok and hit
        print(f"{algo}: first-5 {np.median(first):.3f}, last-5 {np.median(last):.3f} "
              f"({last.min():.3f}-{last.max():.3f}); target {args.target}: {'met' if hit else 'MISSED'}")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3.5))
        steps = np.arange(1, args.iters + 1)
        for algo, runs in curves.items():
            ax.plot(steps, np.median(runs, axis=0), label=f"{algo} (median of {len(args.seeds)} seeds)")
            ax.fill_between(steps, runs.min(axis=0), runs.max(axis=0), alpha=0.2)
        ax.set_xlabel("iteration")
        ax.set_ylabel("mean reward")
        ax.set_title("toy length task, tiny Qwen2, CPU")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
        print(f"plot: {args.plot}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
