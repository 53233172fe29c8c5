"""benchmarks/bench_rollout_balance.py's verdicts, on made-up rounds (no engines): pinned runs are judged on the
stage seconds summed over the rounds, shared runs are reported only, a full run fails when the quick mode's model
gains in the other direction, and the CLI runs get the environment of their placement."""
import os

import pytest

from tests.ut.balance.bench_module import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_rollout_balance")


def rounds(static, queue, imbalance=0.01, gap=0.02, identical=1.0):
    """Rounds with these stage seconds for the static split and both queue ways."""
    out = []
    for s, q in zip(static, queue):
        way = {"stage": q, "imbalance": imbalance, "gap": gap, "identical": identical}
        out.append({"static": {"stage": s, "imbalance": 0.1, "gap": 0.1, "identical": 1.0},
                    "queue": dict(way), "queue_prior": dict(way)})
    return {"rounds": out}


def verdicts(bench, res):
    return {name: (met, judged) for name, met, judged, _ in bench.make_targets(res, 1.0)}


def test_pinned_stage_time_is_judged_on_the_sum_over_rounds(bench):
    # per round 1.25x and 0.83x (median 1.04x), in sum 20 s against 20.5 s: the queue is slower
    slower = {"quick": True, "judged": "14M", "rollout": {"pinned": {"14M": rounds([10.0, 10.0], [8.0, 12.5])}}}
    got = verdicts(bench, slower)
    assert got["stage queue"] == (False, True) and got["stage queue_prior"] == (False, True)
    assert got["imbalance queue"] == (True, True) and got["rows queue"] == (True, True)
    faster = {"quick": True, "judged": "14M", "rollout": {"pinned": {"14M": rounds([10.0, 10.0], [9.0, 10.0])}}}
    assert verdicts(bench, faster)["stage queue"] == (True, True)
    # equal stage time meets the target: the queue is not slower than the static split
    even = {"quick": True, "judged": "14M", "rollout": {"pinned": {"14M": rounds([10.0], [10.0])}}}
    assert verdicts(bench, even)["stage queue"] == (True, True)


def test_shared_runs_are_reported_not_judged(bench):
    res = {"quick": True, "judged": "14M", "rollout": {"pinned": {"14M": rounds([10.0], [9.0])},
                                                       "shared": {"14M": rounds([10.0], [11.0])}}}
    got = verdicts(bench, res)
    assert got["shared stage"] == (False, False)
    assert not [name for name, (met, judged) in got.items() if judged and not met]
    # without a pinned run nothing can be judged: that fails
    assert verdicts(bench, {"quick": True, "judged": "14M", "rollout": {"shared": {"14M": rounds([1.0], [1.0])}}})[
        "pinned run"] == (False, True)


def test_a_full_run_fails_when_the_quick_model_reads_the_other_way(bench):
    agree = {"14M": rounds([10.0], [9.0]), "150M": rounds([10.0], [9.5])}
    res = {"quick": False, "judged": "150M", "rollout": {"pinned": agree, "shared": agree}}
    got = verdicts(bench, res)
    assert got["quick agrees, pinned queue"] == (True, True) and got["quick agrees, shared queue_prior"] == (True, True)
    res["rollout"]["shared"] = {"14M": rounds([10.0], [10.5]), "150M": rounds([10.0], [9.5])}
    assert verdicts(bench, res)["quick agrees, shared queue"] == (False, True)
    res["quick"] = True  # a quick run measures one model: nothing to compare
    assert not any(name.startswith("quick agrees") for name in verdicts(bench, res))


def test_the_cli_runs_get_their_placements_environment(bench):
    base = {"MSRL_THREADS_PER_WORKER": "7", "MSRL_PIN_CORES": "0", "KEEP": "1"}
    pinned, shared = bench.cli_env("pinned", base), bench.cli_env("shared", base)
    assert pinned["MSRL_PIN_CORES"] == "1" and "MSRL_THREADS_PER_WORKER" not in pinned and pinned["KEEP"] == "1"
    assert "MSRL_PIN_CORES" not in shared and shared["OMP_WAIT_POLICY"] == "PASSIVE"
    assert shared["MSRL_THREADS_PER_WORKER"] == str(len(os.sched_getaffinity(0)))
    with pytest.raises(ValueError, match="placement must be one of"):
        bench.cli_env("half", base)
