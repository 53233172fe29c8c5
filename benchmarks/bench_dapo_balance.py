"""DP balance under DAPO dynamic sampling on a long-tail toy task.

Each iteration rolls out batches of G prompts x n samples (response lengths long-tailed), drops the
groups whose rewards are all equal (a prompt is solved by all or by none with a difficulty drawn per
prompt), refills until T groups are kept (or max batches), and cuts the kept rows into the train
stage's DP shares with the dock's planner (BalancePlanner.make_plan with n_shares, as plan_stage does
for a filtered round): balanced vs a seeded random split. Prints per iteration kept/dropped groups,
rows and the per-rank imbalance (max / mean - 1) both ways.

    python benchmarks/bench_dapo_balance.py [--dp 8] [--iters 8] [--quick]
"""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
from mindspeed_rl.balance.balance_plan import BalancePlanner  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dp", type=int, default=8)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32, help="G: prompts per rollout batch")
    ap.add_argument("--train", type=int, default=32, help="T: filter_groups_train_batch_size")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-batches", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.iters, args.dp = 3, 4
    rng = np.random.default_rng(0)
    print(f"DP={args.dp}, G={args.prompts} prompts x n={args.n}, train batch T={args.train} groups, "
          f"max {args.max_batches} rollout batches; one train share per rank")
    print("iter | batches | kept | dropped | trained rows | rows/rank | imbalance balanced | random")
    worst = []
    for it in range(1, args.iters + 1):
        kept_lengths, kept, dropped, batches = [], 0, 0, 0
        while len(kept_lengths) < args.train and batches < args.max_batches:
            batches += 1
            for _ in range(args.prompts):
                p = rng.beta(0.6, 0.6)  # per-prompt solve rate: many prompts are all-right or all-wrong
                solved = rng.random(args.n) < p
                if solved.all() or not solved.any():
                    dropped += 1
                    continue
                kept += 1
                if len(kept_lengths) < args.train:
                    prompt = rng.integers(50, 400)
                    kept_lengths.append(prompt + np.minimum(rng.lognormal(6.0, 0.9, args.n).astype(int) + 16, 8192))
        lengths = torch.tensor(np.concatenate(kept_lengths)).reshape(-1, 1)
        rows = lengths.shape[0]
        units = torch.arange(rows)
        out = []
        for balanced in (True, False):
            planner = BalancePlanner(seed=it)
            shares = planner.make_plan("actor_train", units, -(-rows // args.dp), lambda u: lengths[u],
                                       balanced=balanced, n_shares=args.dp)
            loads = [float(lengths[s].sum()) for s in shares]
            sizes = [len(s) for s in shares]
            assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
            out.append((max(loads) / np.mean(loads) - 1, sizes))
        worst.append(out[0][0])
        print(f"{it:4d} | {batches:7d} | {kept:4d} | {dropped:7d} | {rows:12d} | "
              f"{min(out[0][1])}-{max(out[0][1]):<5} | {out[0][0]:18.3%} | {out[1][0]:.3%}")
    print(f"worst balanced imbalance {max(worst):.3%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
