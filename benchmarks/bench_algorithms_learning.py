"""Each registered algorithm on the toy 'length' task, through the real job (Ray, DP=2, the CLI's run).

For every algorithm of tests/st/algorithm_cases.py and GRPO for reference: the mean reward of the first and
last 5 of 60 iterations over ``--seeds``; the table gives the median last-5 with its min-max and the run time.
Exits 1 when an algorithm's median last-5 reward is not above ``--target`` (the learning test's 0.8).

    python benchmarks/bench_algorithms_learning.py [--seeds 7 8 9] [--target 0.8] [--only RLOO CISPO]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "st")]
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from algorithm_cases import ALGORITHMS, LENGTH_TASK  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")


def one(name, overrides, seed):
    from cli.train_grpo import run
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        history = run(CONFIG, LENGTH_TASK + [f"rl_config.seed={seed}"] + overrides, folder,
                      os.path.join(folder, "tiny_model"))
        seconds = time.perf_counter() - start
    rewards = np.array([m["reward/mean"] for m in history])
    return rewards[:5].mean(), rewards[-5:].mean(), seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 8, 9])
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--only", nargs="+", default=None)
    args = parser.parse_args(argv)
    cases = {"GRPO": [], **ALGORITHMS}
    names = [n for n in cases if args.only is None or n in args.only]
    rows, missed = [], []
    for name in names:
        runs = [one(name, cases[name], seed) for seed in args.seeds]
        first, last, secs = (np.array([r[i] for r in runs]) for i in range(3))
        rows.append(f"| {name} | {' '.join(cases[name]) or '(defaults)'} | {np.median(first):.3f} | "
                    f"{np.median(last):.3f} ({last.min():.3f}-{last.max():.3f}) | {np.median(secs):.0f} s |")
        print(rows[-1], flush=True)
        if np.median(last) <= args.target:
            missed.append(name)
    print(f"\nlength task, 16 prompts x 8 samples, 60 iterations, DP=2, seeds {args.seeds}; medians over seeds\n")
    print("| algorithm | overrides | reward first-5 | reward last-5 (min-max) | run time |")
    print("| --- | --- | ---: | ---: | ---: |")
    print("\n".join(rows))
    if missed:
        print(f"\nmissed the target (median last-5 > {args.target}): {', '.join(missed)}")
        return 1
    print(f"\nevery algorithm above {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
