#!/usr/bin/env python3
"""Probe seqlen_balancing mutants on random inputs (used to sort its survivors, see SURVIVORS.md).

    python3 tests/mutation/seqlen_probe.py MUTANT...   (names as mutmut prints them; after a run)

Imports the mutated copy in .mutation/seqlen_balancing/mutants and switches mutants through mutmut's
trampoline (MUTANT_UNDER_TEST): 120 balancer calls (every method, equal and free sizes) and 60
micro-batch calls (with and without a synced minimum). Prints per mutant 'worse' (an invalid result, an
error, a heavier partition or more micro-batches), 'differs' or 'same', with the case ids.
"""
import json
import os
import sys
import time

import numpy as np

WORK = os.environ.get("MUTATION_WORK", os.path.join(os.path.dirname(__file__), "..", "..", ".mutation"))
sys.path.insert(0, os.path.join(WORK, "seqlen_balancing", "mutants"))
os.environ["MUTANT_UNDER_TEST"] = ""
from mindspeed_rl.balance import seqlen_balancing as sb  # noqa: E402


def cases():
    rng = np.random.default_rng(0)
    out = []
    for i in range(120):
        k = int(rng.choice([1, 2, 3, 4, 5, 8]))
        n = int(rng.integers(k, 6 * k + 8))
        kind = i % 3
        if kind == 0: w = rng.integers(1, 30, n)
        elif kind == 1: w = rng.integers(1, 4, n)
        else: w = np.round(rng.pareto(1.5, n) * 100 + 1).astype(int)
        out.append(("part", w.tolist(), k, bool(i % 2), ["auto", "heapq", "karmarkar_karp", "greedy"][i % 4]))
    for i in range(60):
        n = int(rng.integers(1, 40)); w = rng.integers(1, 50, n)
        cap = int(w.max() + rng.integers(0, 60))
        mn = [None, None, int(rng.integers(1, 8)), int(rng.integers(1, 60))][i % 4]
        out.append(("micro", w.tolist(), cap, mn))
    return out

def run(c):
    try:
        if c[0] == "part":
            _, w, k, eq, method = c
            if method == "heapq" and eq and len(w) % k: eq = False
            parts = sb.get_seqlen_balanced_partitions(w, k, eq, method=method)
            wa = np.array(w, float)
            loads = [wa[p].sum() for p in parts]; cnt = [len(p) for p in parts]
            ok = sorted(i for p in parts for i in p) == list(range(len(w))) and len(parts) == k
            if eq: ok = ok and max(cnt) - min(cnt) <= 1
            ok = ok and min(cnt) >= 1
            st = sb.balance_stats(w, parts)
            return (ok, max(loads), parts, json.dumps(st, sort_keys=True), sb.sized_lower_bound(w, k, eq))
        else:
            _, w, cap, mn = c
            mbs = sb.rearrange_micro_batches(w, cap, mn)
            wa = np.array(w, float)
            ok = sorted(i for p in mbs for i in p) == list(range(len(w))) and all(wa[p].sum() <= cap for p in mbs if p)
            if mn: ok = ok and len(mbs) >= mn
            return (ok, len(mbs), mbs, max((wa[p].sum() for p in mbs if p), default=0))
    except Exception as e:
        return (False, repr(e)[:60])



def main(names):
    allc = cases()
    base = [run(c) for c in allc]
    for name in names:
        os.environ["MUTANT_UNDER_TEST"] = name
        t = time.time(); worse = []; differs = []
        for i, c in enumerate(allc):
            if time.time() - t > 20: break
            r = run(c); b = base[i]
            if r != b:
                differs.append(i)
                if (not r[0]) or (len(r) > 1 and len(b) > 1 and r[1] > b[1]) or (c[0] == "micro" and len(r) > 3 and r[1] == b[1] and r[3] > b[3]):
                    worse.append(i)
        print(("worse" if worse else "differs" if differs else "same"), name, worse[:15], differs[:8], flush=True)
    os.environ["MUTANT_UNDER_TEST"] = ""


if __name__ == "__main__":
    main(sys.argv[1:])
