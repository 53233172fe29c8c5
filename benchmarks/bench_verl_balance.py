"""verl's DP balance before and after our patch series (patches/verl/0.9.1/).

Downloads verl 0.9.1's source with pip (or takes $VERL_SDIST), applies the
series to a copy, and runs both trees' ``verl.utils.seqlen_balancing`` on the
cases of benchmarks/bench_balance.py:

1. ``get_seqlen_balanced_partitions(weights, k, equal_size=True)``: excess of
   the heaviest part over the sized lower bound (sgap), per case;
2. ``get_group_balanced_partitions`` on the sample-level cases (a prompt's
   samples share a uid, verl's workload per sample);
3. ``rearrange_micro_batches``: micro-batch count and the largest token sum
   over the cap on random padded batches.

Prints the tables and a TARGETS block; exits 1 when a target fails
(target: the patched summed sgap at most 0.25x verl's, in both 1 and 2).

Usage:
    python benchmarks/bench_verl_balance.py [--quick] [--seeds N] [--json PATH]
"""
import argparse
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "patches" / "tests"))

import verl_tree  # noqa: E402
from bench_balance import make_items, quality_cases  # noqa: E402
from mindspeed_rl.balance.seqlen_balancing import sized_lower_bound  # noqa: E402

TARGET_RATIO = 0.25


def seed_of(key: str, s: int) -> int:
    return zlib.crc32(key.encode()) % 1_000_000 * 100 + s


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, (time.perf_counter() - t0) * 1e3


def heaviest(weights, parts):
    return max(sum(weights[i] for i in p) for p in parts)


def check(parts, n, k):
    assert len(parts) == k and sorted(i for p in parts for i in p) == list(range(n)), "invalid partition"


def partition_rows(mods, cases, seeds):
    rows = []
    for level, gen, n, k, per_rank in cases:
        key = f"{level}/{gen}/{n}/{k}/{per_rank}"
        row = {"case": key, "level": level, "k": k, "items": k * per_rank}
        for name, mod in mods.items():
            sg, ms = [], []
            for s in range(seeds):
                w = make_items(gen, level, n, k, per_rank, seed_of(key, s))
                parts, t = timed(mod.get_seqlen_balanced_partitions, w, k_partitions=k, equal_size=True)
                check(parts, len(w), k)
                sg.append(heaviest(w, parts) / sized_lower_bound(w, k, True) - 1.0)
                ms.append(t)
            row[name] = {"sgap": float(np.mean(sg)), "ms": float(np.median(ms))}
        rows.append(row)
    return rows


def group_rows(mods, cases, seeds):
    """Sample-level cases through get_group_balanced_partitions (uid = prompt)."""
    rows = []
    for level, gen, n, k, per_rank in cases:
        if level != "sample":
            continue
        key = f"group-api/{gen}/{n}/{k}/{per_rank}"
        row = {"case": key, "k": k, "items": k * per_rank}
        for name, mod in mods.items():
            sg, ms = [], []
            for s in range(seeds):
                lens = make_items(gen, "sample", n, k, per_rank, seed_of(key, s))
                uids = [i // n for i in range(len(lens))]
                work = mods["verl"].calculate_workload(torch.tensor(lens)).tolist()
                group_w = [sum(work[g * n:(g + 1) * n]) for g in range(len(lens) // n)]
                parts, t = timed(mod.get_group_balanced_partitions, lens, uids, k)
                check(parts, len(lens), k)
                sg.append(heaviest(work, parts) / sized_lower_bound(group_w, k, True) - 1.0)
                ms.append(t)
            row[name] = {"sgap": float(np.mean(sg)), "ms": float(np.median(ms))}
        rows.append(row)
    return rows


def micro_rows(mods, batches):
    out = {name: {"micro_batches": 0, "over_cap": 0, "fill": []} for name in mods}
    rng = np.random.default_rng(7)
    for _ in range(batches):
        n = int(rng.integers(8, 64))
        lens = np.clip(rng.lognormal(np.log(1500), 0.9, n), 16, 8192).astype(int).tolist()
        width = max(lens)
        cap = max(width, int(sum(lens) // rng.integers(2, 8)))
        mask = torch.zeros(n, width, dtype=torch.int64)
        for i, m in enumerate(lens):
            mask[i, :m] = 1
        batch = {"input_ids": torch.zeros(n, width, dtype=torch.int64), "attention_mask": mask}
        for name, mod in mods.items():
            _, idx = mod.rearrange_micro_batches(batch, max_token_len=cap)
            tokens = [sum(lens[i] for i in p) for p in idx]
            out[name]["micro_batches"] += len(idx)
            out[name]["over_cap"] += sum(t > cap for t in tokens)
            out[name]["fill"].append(sum(lens) / (len(idx) * cap))
    for v in out.values():
        v["fill"] = float(np.mean(v["fill"]))
    return out


def print_table(title, rows):
    print(title)
    print(f"{'case':<34} {'items':>6} {'verl sgap%':>11} {'patched sgap%':>14} {'verl ms':>9} {'patched ms':>11}")
    for r in rows:
        print(f"{r['case']:<34} {r['items']:>6} {100 * r['verl']['sgap']:>11.3f} {100 * r['patched']['sgap']:>14.3f} "
              f"{r['verl']['ms']:>9.1f} {r['patched']['ms']:>11.1f}")
    sv = sum(r["verl"]["sgap"] for r in rows)
    sp = sum(r["patched"]["sgap"] for r in rows)
    print(f"{'sum over ' + str(len(rows)) + ' cases (pp)':<41} {100 * sv:>11.2f} {100 * sp:>14.2f}")
    print()
    return sv, sp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="bench_balance's quick cases, one seed")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per case (default 2, quick 1)")
    ap.add_argument("--json", type=str, default=None, help="save the rows to this JSON file")
    args = ap.parse_args()
    seeds = args.seeds or (1 if args.quick else 2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            source = verl_tree.released_source(work / "sdist")
        except verl_tree.SourceUnavailable as exc:
            print(f"bench_verl_balance: {exc}; set VERL_SDIST to a local verl-{verl_tree.VERSION}.tar.gz",
                  file=sys.stderr)
            return 2
        original, patched, _ = verl_tree.prepare_trees(work, source)
        mods = {"verl": verl_tree.load_seqlen_balancing(original),
                "patched": verl_tree.load_seqlen_balancing(patched)}
        assert mods["patched"].get_balance_partitioner() == "refined"
        cases = quality_cases(args.quick)
        print(f"verl {verl_tree.VERSION} vs verl {verl_tree.VERSION} + patches/verl/{verl_tree.VERSION}; "
              f"{seeds} seed(s) per case")
        print("sgap = heaviest part / sized lower bound - 1 (mean over seeds); ms = median call time\n")
        rows = partition_rows(mods, cases, seeds)
        sv, sp = print_table("== 1. get_seqlen_balanced_partitions(equal_size=True), bench_balance cases ==", rows)
        grows = group_rows(mods, cases, seeds)
        gv, gp = print_table("== 2. get_group_balanced_partitions (uid = prompt, verl's workload per sample) ==",
                             grows)
        micro = micro_rows(mods, 10 if args.quick else 40)
        print("== 3. rearrange_micro_batches on random padded batches ==")
        for name, v in micro.items():
            print(f"{name:<8} micro-batches {v['micro_batches']:>5}  over the cap {v['over_cap']:>3}  "
                  f"mean fill {100 * v['fill']:.1f}%")
        print()
    ok_parts = sp <= TARGET_RATIO * sv
    ok_groups = gp <= TARGET_RATIO * gv
    ok_cap = micro["patched"]["over_cap"] == 0
    print("TARGETS")
    print(f"partitions : {'PASS' if ok_parts else 'FAIL'}  summed sgap {100 * sp:.2f} pp vs verl {100 * sv:.2f} pp "
          f"(ratio {sp / sv if sv else float('nan'):.3f}, target <= {TARGET_RATIO})")
    print(f"groups     : {'PASS' if ok_groups else 'FAIL'}  summed sgap {100 * gp:.2f} pp vs verl {100 * gv:.2f} pp "
          f"(ratio {gp / gv if gv else float('nan'):.3f}, target <= {TARGET_RATIO})")
    print(f"token cap  : {'PASS' if ok_cap else 'FAIL'}  patched micro-batches over max_token_len: "
          f"{micro['patched']['over_cap']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"partitions": rows, "groups": grows, "micro": micro,
                                               "seeds": seeds, "quick": args.quick}, indent=1))
    return 0 if ok_parts and ok_groups and ok_cap else 1


if __name__ == "__main__":
    sys.exit(main())
