#!/usr/bin/env python3
"""Probe partition_refine mutants on random inputs (used to sort its survivors, see SURVIVORS.md).

    python3 tests/mutation/refine_probe.py MUTANT...   (names as mutmut prints them; after a run)

Imports the mutated copy in .mutation/partition_refine/mutants and switches mutants through mutmut's
trampoline (MUTANT_UNDER_TEST), running 250 seeded cases (k 2..40, up to 243 items, tight and free
counts, three work budgets) with each. Prints per mutant: 'worse' and the case ids where the heaviest
load ends above the original's (or the bounds break, or it raises), else 'same' / 'differs' (another
assignment or load, never heavier).
"""
import os
import sys
import time

import numpy as np

WORK = os.environ.get("MUTATION_WORK", os.path.join(os.path.dirname(__file__), "..", "..", ".mutation"))
sys.path.insert(0, os.path.join(WORK, "partition_refine", "mutants"))
os.environ["MUTANT_UNDER_TEST"] = ""
from mindspeed_rl.balance import partition_refine as pr  # noqa: E402


def cases():
    rng = np.random.default_rng(0)
    for i in range(250):
        k = int(rng.choice([2, 3, 4, 5, 17, 18, 20, 40]))
        n = int(rng.integers(1, 6 * k + 3))
        kind = i % 3
        if kind == 0:
            w = rng.integers(1, 30, n).astype(float)
        elif kind == 1:
            w = rng.integers(1, 4, n).astype(float)
        else:
            w = np.round(rng.pareto(1.5, n) * 100 + 1)
        eq = i % 2 == 0
        lo, hi = ((n // k, -(-n // k)) if eq else (1, n))
        if lo < 1:
            lo = 1 if not eq else 0
        start = rng.permutation(np.arange(n) % k) if eq else rng.integers(0, k, n)
        work = int(rng.choice([pr.DEFAULT_WORK, 200_000, 60_000]))
        yield dict(w=w, k=k, lo=lo, hi=hi, start=start.astype(np.int64), work=work)


def run(c):
    try:
        out = pr.refine_assignment(c["w"], c["start"].copy(), c["k"], min_count=c["lo"], max_count=c["hi"],
                                   work=c["work"])
        counts = np.bincount(out, minlength=c["k"])
        if counts.min() < c["lo"] or counts.max() > c["hi"]:
            return np.inf, None
        return float(np.bincount(out, weights=c["w"], minlength=c["k"]).max()), out.tolist()
    except Exception:  # noqa: BLE001 - a crash counts as worse
        return np.inf, None


def main(names):
    all_cases = list(cases())
    base = [run(c) for c in all_cases]
    for name in names:
        os.environ["MUTANT_UNDER_TEST"] = name
        start, worse, differs = time.time(), [], False
        for i, c in enumerate(all_cases):
            if time.time() - start > 30:
                break
            got = run(c)
            worse += [i] if got[0] > base[i][0] else []
            differs |= got != base[i]
        print(f"{'worse' if worse else 'differs' if differs else 'same'} {name} {worse[:20] if worse else ''}",
              flush=True)
    os.environ["MUTANT_UNDER_TEST"] = ""


if __name__ == "__main__":
    main(sys.argv[1:])
