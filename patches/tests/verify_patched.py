#!/usr/bin/env python3
"""Check an upstream MindSpeed-RL tree patched with patches/apply.sh.

    python patches/tests/verify_patched.py <upstream-dir> [--ours <our repo>]

What it runs, with the upstream tree first on sys.path:

* the patched balancer (``mindspeed_rl.utils.seqlen_balancing``) on generated
  long-tail GRPO batches, compared with our package (run in a subprocess from
  ``--ours``, default: the repository holding this script): the same
  partitions, hence the same imbalance;
* ``rearrange_micro_batches`` through upstream's signature: the token cap
  holds, and with a 2-process gloo group every rank gets the same count;
* one round of the patched ``GRPOTransferDock`` (the in-process class behind
  the Ray actor) with balance on: every row served once, whole GRPO groups,
  the same shares and imbalance as our dock; plus pools that are not a
  multiple of the request size, plans dropped by rows taken outside them,
  dp_balance metrics and the bounded wait;
* at upstream head, the transfer queue manager's balance plan (shards
  replaced by an in-memory length table).

Upstream's package ``__init__`` files import the whole training stack
(megatron, vllm, datasets, ...). They are bypassed: ``mindspeed_rl``,
``mindspeed_rl.utils``, ``mindspeed_rl.trainer`` and
``mindspeed_rl.trainer.utils`` are registered as bare packages over the
upstream directories, and ``mindspeed_rl.utils.is_multimodal`` is taken from
upstream's ``mindspeed_rl/utils/utils.py``. Third-party modules that are not
installed (typically torch_npu, tensordict, omegaconf, zmq, torchvision) get
small stand-ins in ``sys.modules``; the script prints which.

Prints PASS/FAIL per check and a summary; exits 1 on any failure, 2 on
usage errors.
"""
import argparse
import importlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
OURS_DEFAULT = os.path.abspath(os.path.join(HERE, "..", ".."))

RESULTS = []


def record(name, ok, detail=""):
    RESULTS.append((name, bool(ok), detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)


def check(name):
    """Decorator: run a check, turning exceptions into a FAIL."""
    def wrap(fn):
        def run(*args, **kwargs):
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # report and go on with the other checks
                record(name, False, f"{type(exc).__name__}: {exc}")
                traceback.print_exc()
        return run
    return wrap


# ---------------------------------------------------------------- import setup

STUBBED = []


class _StandIns:
    """Meta-path finder placed last: it only answers for the listed
    third-party modules, and only when no installed module was found."""

    def __init__(self, factories):
        self.factories = factories

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery
        if name in self.factories:
            return importlib.machinery.ModuleSpec(name, self, is_package=name == "torchvision")
        return None

    def create_module(self, spec):
        module = self.factories[spec.name]()
        if spec.name not in STUBBED:
            STUBBED.append(spec.name)
        return module

    def exec_module(self, module):
        pass


def _torch_npu():
    npu = types.ModuleType("torch_npu")
    mstx = types.SimpleNamespace(range_start=lambda *a, **k: 0, range_end=lambda *a, **k: None)
    npu.npu = types.SimpleNamespace(mstx=mstx)
    return npu


def _tensordict():
    td = types.ModuleType("tensordict")

    class TensorDict(dict):
        """dict stand-in: from_dict and subscripted annotations."""
        def __class_getitem__(cls, item):
            return cls

        @classmethod
        def from_dict(cls, data):
            return cls(data)

    td.TensorDict = TensorDict
    return td


def _stub_missing_third_party():
    """Stand-ins for missing third-party modules, created on first import."""
    sys.meta_path.append(_StandIns({
        "torch_npu": _torch_npu,
        "tensordict": _tensordict,
        "omegaconf": lambda: types.ModuleType("omegaconf"),
        "zmq": lambda: types.ModuleType("zmq"),
        "torchvision": lambda: types.ModuleType("torchvision"),
        "torchvision.transforms": lambda: types.ModuleType("torchvision.transforms"),
    }))


def setup_upstream(updir):
    """Upstream first on sys.path; bare packages instead of the heavy __init__ files."""
    sys.path.insert(0, updir)
    for name in ("mindspeed_rl", "mindspeed_rl.utils", "mindspeed_rl.trainer", "mindspeed_rl.trainer.utils"):
        pkg = types.ModuleType(name)
        pkg.__path__ = [os.path.join(updir, *name.split("."))]
        pkg.__package__ = name
        sys.modules[name] = pkg
    _stub_missing_third_party()
    utils = importlib.import_module("mindspeed_rl.utils.utils")
    sys.modules["mindspeed_rl.utils"].is_multimodal = utils.is_multimodal


# ---------------------------------------------------------------- generated data


def long_tail_batch(seed, n_groups, n_samples, max_len=8192):
    """Prompt and response lengths of a GRPO batch: per-group difficulty, long tail."""
    import numpy as np
    rng = np.random.default_rng(seed)
    prompts = rng.integers(32, 1024, size=n_groups)
    scale = rng.lognormal(0.0, 0.7, size=(n_groups, 1))
    base = rng.lognormal(6.0, 0.8, size=(n_groups, n_samples)) * scale
    tail = rng.pareto(1.2, size=(n_groups, n_samples)) * 600
    heavy = rng.random((n_groups, n_samples)) < 0.2
    responses = np.where(heavy, base + tail, base)
    responses = np.clip(responses, 1, max_len - 1024).astype(int)
    return prompts.tolist(), responses.tolist()


def balancer_cases():
    cases = []
    for seed, (groups, n, k) in enumerate([(16, 8, 4), (32, 8, 8), (64, 16, 16), (128, 4, 32),
                                           (256, 8, 64), (24, 8, 16), (10, 4, 4), (7, 16, 3)]):
        prompts, responses = long_tail_batch(100 + seed, groups, n)
        group_costs = [n * p + sum(r) for p, r in zip(prompts, responses)]
        row_costs = [p + x for p, r in zip(prompts, responses) for x in r]
        cases.append({"name": f"groups{groups}x{n}_k{k}", "fn": "balanced", "w": group_costs, "k": k,
                      "equal": True})
        if len(row_costs) % k == 0 and len(row_costs) <= 2048:
            cases.append({"name": f"rows{len(row_costs)}_k{k}", "fn": "balanced", "w": row_costs, "k": k,
                          "equal": True})
            cases.append({"name": f"rows{len(row_costs)}_k{k}_heapq", "fn": "heapq", "w": row_costs, "k": k,
                          "equal": True})
        cases.append({"name": f"rows{len(row_costs)}_k{k}_free", "fn": "balanced", "w": row_costs, "k": k,
                      "equal": False})
        cases.append({"name": f"groups{groups}x{n}_k{k}_kk", "fn": "karmarkar_karp", "w": group_costs,
                      "k": min(k, groups), "equal": False})
        cap = max(max(row_costs), 16384)
        cases.append({"name": f"rows{len(row_costs)}_microbatch{cap}", "fn": "micro", "w": row_costs, "cap": cap})
    return cases


# Shared with the subprocess that runs our package (sent as source text).
def run_balancer_case(sb, case):
    w, fn = case["w"], case["fn"]
    if fn == "balanced":
        return sb.get_seqlen_balanced_partitions(w, case["k"], equal_size=case["equal"])
    if fn == "heapq":
        return [sorted(p) for p in sb.heapq_partition(w, case["k"], equal_size=case["equal"])]
    if fn == "karmarkar_karp":
        return [sorted(p) for p in sb.karmarkar_karp(w, case["k"], equal_size=case["equal"])]
    if fn == "micro":
        return sb.rearrange_micro_batches(w, case["cap"])
    raise ValueError(fn)


def imbalance(w, parts):
    loads = [sum(w[i] for i in p) for p in parts]
    mean = sum(w) / len(parts)
    return max(loads) / mean - 1 if mean else 0.0


# Shared with the subprocess (source text): one dock round with balance on.
def run_dock_round(dock_cls, metric_cls, spec, extra_kwargs):
    import torch
    groups, n, dp = spec["groups"], spec["n"], spec["dp"]
    prompts, responses = spec["prompts"], spec["responses"]
    td = dock_cls(groups, n, metric_cls(), **extra_kwargs)
    rows = list(range(groups * n))
    td.put_experience({
        "prompts": [torch.arange(prompts[r // n]) for r in rows],
        "prompt_length": [torch.tensor([prompts[r // n]]) for r in rows],
    }, indexes=rows)
    td.put_experience({
        "responses": [torch.arange(responses[r // n][r % n]) for r in rows],
        "response_length": [torch.tensor([responses[r // n][r % n]]) for r in rows],
    }, indexes=rows)
    out = {}
    for consumer, per_group in (("actor_train", True), ("ref_log_prob", False)):
        count = groups * n // dp
        served = []
        for _ in range(dp):
            _, idx = td.get_experience(consumer, ["prompts", "responses"], count,
                                       get_n_samples=per_group, use_batch_seqlen_balance=True)
            served.append([int(i) for i in idx] if idx else None)
        extra = td.get_experience(consumer, ["prompts", "responses"], count,
                                  get_n_samples=per_group, use_batch_seqlen_balance=True)
        out[consumer] = {"served": served, "after": list(extra[1]) if extra[1] else None}
    history = td.get_balance_history()
    out["history"] = [[float(x) for x in h["loads"]] for h in history]
    return out


def run_ours(ours_dir, payload):
    """Run our package's balancer and dock on ``payload`` in a fresh interpreter."""
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, OURS)
        payload = json.load(sys.stdin)
        from mindspeed_rl.utils import seqlen_balancing as sb
        from mindspeed_rl.trainer.utils.transfer_dock import GRPOTransferDock
        from mindspeed_rl.utils.metrics import Metric
        out = {"balancer": {}, "dock": {}}
        for case in payload["balancer"]:
            out["balancer"][case["name"]] = run_balancer_case(sb, case)
        for spec in payload["dock"]:
            out["dock"][spec["name"]] = run_dock_round(GRPOTransferDock.__ray_actor_class__, Metric, spec, {})
        json.dump(out, sys.stdout)
    """).replace("OURS", repr(ours_dir))
    source = "\n".join([inspect.getsource(run_balancer_case), inspect.getsource(run_dock_round), code])
    env = dict(os.environ, PYTHONPATH=ours_dir)
    proc = subprocess.run([sys.executable, "-c", source], input=json.dumps(payload), capture_output=True,
                          text=True, cwd=ours_dir, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"our package failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


# ---------------------------------------------------------------- checks


def dock_specs():
    specs = []
    for seed, (groups, n, dp) in enumerate([(16, 8, 4), (64, 4, 8), (32, 16, 16)]):
        prompts, responses = long_tail_batch(500 + seed, groups, n)
        specs.append({"name": f"dock_g{groups}_n{n}_dp{dp}", "groups": groups, "n": n, "dp": dp,
                      "prompts": prompts, "responses": responses})
    return specs


def dock_class(module):
    cls = module.GRPOTransferDock
    return getattr(cls, "__ray_actor_class__", cls)


def upstream_dock_kwargs(cls, groups):
    params = inspect.signature(cls.__init__).parameters
    return {"GBS_train": groups} if "GBS_train" in params else {}


@check("balancer matches ours")
def check_balancer(sb, cases, ours):
    bad = []
    worst = 0.0
    for case in cases:
        mine = run_balancer_case(sb, case)
        theirs = ours["balancer"][case["name"]]
        if mine != theirs:
            bad.append(case["name"])
            continue
        flat = sorted(i for p in mine for i in p)
        if flat != list(range(len(case["w"]))):
            bad.append(case["name"] + " (not a partition)")
        if case["fn"] == "micro":
            over = [sum(case["w"][i] for i in p) for p in mine if sum(case["w"][i] for i in p) > case["cap"]]
            if over:
                bad.append(case["name"] + f" (token cap exceeded: {over[:3]})")
        elif case["fn"] == "balanced" and case["equal"]:
            sizes = [len(p) for p in mine]
            if max(sizes) - min(sizes) > 1:
                bad.append(case["name"] + f" (count skew {max(sizes) - min(sizes)})")
            worst = max(worst, imbalance(case["w"], mine))
    record("balancer matches ours", not bad,
           f"{len(cases)} cases identical partitions, worst equal-size imbalance {worst:.4%}" if not bad
           else f"differs or invalid: {bad}")


@check("micro-batches: token cap and upstream signature")
def check_micro(sb):
    import numpy as np
    rng = np.random.default_rng(7)
    bad = []
    for trial in range(20):
        lengths = (rng.pareto(1.1, size=int(rng.integers(8, 200))) * 300 + 16).astype(int)
        cap = int(max(lengths.max(), rng.integers(1024, 16384)))
        parts = sb.rearrange_micro_batches(lengths.tolist(), cap)  # (seqlen_list, max_token_len)
        loads = [int(lengths[p].sum()) for p in parts if len(p)]
        if max(loads) > cap or sorted(i for p in parts for i in p) != list(range(lengths.size)):
            bad.append(trial)
    params = list(inspect.signature(sb.rearrange_micro_batches).parameters)
    record("micro-batches: token cap and upstream signature", not bad and "dp_group" in params,
           f"20 random batches within the cap; parameters {params}")


def _dist_worker(rank, world, updir, port, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    setup_upstream(updir)
    import numpy as np
    import torch.distributed as dist
    from mindspeed_rl.utils import seqlen_balancing as sb
    rng = np.random.default_rng(rank)
    cap = 4096
    lengths = np.clip(rng.pareto(1.1, size=40 + 60 * rank) * 300 + 16, 16, cap).astype(int)
    local = len(sb.rearrange_micro_batches(lengths.tolist(), cap))  # before any process group
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parts = sb.rearrange_micro_batches(lengths.tolist(), cap, dp_group=None)
    ok = all(int(lengths[p].sum()) <= cap for p in parts if len(p))
    ok = ok and sorted(i for p in parts for i in p) == list(range(lengths.size))
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump({"local": local, "count": len(parts), "cap_ok": ok}, f)
    dist.destroy_process_group()


@check("micro-batch count synced over a gloo group")
def check_dist(updir):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as outdir:
        mp.spawn(_dist_worker, args=(2, updir, port, outdir), nprocs=2, join=True)
        res = [json.load(open(os.path.join(outdir, f"rank{r}.json"))) for r in range(2)]
    counts, local = [r["count"] for r in res], [r["local"] for r in res]
    record("micro-batch count synced over a gloo group",
           counts == [max(local)] * 2 and all(r["cap_ok"] for r in res),
           f"local counts {local} -> synced {counts}, token cap held on both ranks")


def _loads(spec, idx):
    n = spec["n"]
    return sum(spec["prompts"][r // n] + spec["responses"][r // n][r % n] for r in idx)


@check("dock round matches ours")
def check_dock_round(td_mod, metric_cls, specs, ours):
    cls = dock_class(td_mod)
    notes, bad = [], []
    for spec in specs:
        mine = run_dock_round(cls, metric_cls, spec, upstream_dock_kwargs(cls, spec["groups"]))
        theirs = ours["dock"][spec["name"]]
        n, total = spec["n"], spec["groups"] * spec["n"]
        for consumer in ("actor_train", "ref_log_prob"):
            served = mine[consumer]["served"]
            if any(s is None for s in served):
                bad.append(f"{spec['name']}/{consumer}: a rank got no data")
                continue
            flat = sorted(i for s in served for i in s)
            if flat != list(range(total)):
                bad.append(f"{spec['name']}/{consumer}: rows not served exactly once")
            if consumer == "actor_train":
                for s in served:
                    groups = {}
                    for r in s:
                        groups.setdefault(r // n, set()).add(r)
                    if any(len(g) != n for g in groups.values()):
                        bad.append(f"{spec['name']}: a GRPO group was split")
            if mine[consumer]["after"] is not None:
                bad.append(f"{spec['name']}/{consumer}: data served after the round")
            if [sorted(s) for s in served] != [sorted(s) for s in theirs[consumer]["served"]]:
                bad.append(f"{spec['name']}/{consumer}: shares differ from ours")
            loads = [_loads(spec, s) for s in served]
            imb = max(loads) / (sum(loads) / len(loads)) - 1
            notes.append(f"{spec['name']}/{consumer} imbalance {imb:.4%}")
        if mine["history"] != theirs["history"]:
            bad.append(f"{spec['name']}: plan loads differ from ours")
    record("dock round matches ours", not bad, "; ".join(notes) if not bad else "; ".join(bad))


def _fill(td, spec, groups_ready):
    import torch
    n = spec["n"]
    rows = [r for g in groups_ready for r in range(g * n, (g + 1) * n)]
    td.put_experience({
        "prompts": [torch.arange(spec["prompts"][r // n]) for r in rows],
        "prompt_length": [torch.tensor([spec["prompts"][r // n]]) for r in rows],
        "responses": [torch.arange(spec["responses"][r // n][r % n]) for r in rows],
        "response_length": [torch.tensor([spec["responses"][r // n][r % n]]) for r in rows],
    }, indexes=rows)


@check("dock: partial pools, stale plans, metrics")
def check_dock_edges(td_mod, metric_cls):
    cls = dock_class(td_mod)
    prompts, responses = long_tail_batch(900, 12, 4)
    spec = {"n": 4, "prompts": prompts, "responses": responses}
    cols = ["prompts", "responses"]
    bad = []

    # 10 of 12 groups ready, 4 groups per request: exact shares, the rest waits
    metrics = metric_cls()
    td = cls(12, 4, metrics, **upstream_dock_kwargs(cls, 12))
    _fill(td, spec, range(10))
    got = []
    for _ in range(2):
        _, idx = td.get_experience("actor_train", cols, 16, use_batch_seqlen_balance=True)
        got.append(idx)
    _, early = td.get_experience("actor_train", cols, 16, use_batch_seqlen_balance=True)
    if early:
        bad.append("served a share with too few ready groups")
    _fill(td, spec, [10, 11])
    _, last = td.get_experience("actor_train", cols, 16, use_batch_seqlen_balance=True)
    got.append(last)
    if any(not g or len(g) != 16 for g in got):
        bad.append(f"share sizes {[len(g) if g else 0 for g in got]} (want 16 each)")
    elif sorted(i for g in got for i in g) != list(range(48)):
        bad.append("partial pools: rows not served exactly once")
    if "dp_balance/actor_train/imbalance" not in metrics.metric:
        bad.append("no dp_balance/actor_train/imbalance metric")

    # rows taken by index outside the plan: the plan must not serve them again
    td = cls(8, 4, metric_cls(), **upstream_dock_kwargs(cls, 8))
    _fill(td, spec, range(8))
    _, first = td.get_experience("actor_train", cols, 8, use_batch_seqlen_balance=True)
    taken = sorted(set(range(32)) - set(first))[:4]
    td.get_experience("actor_train", cols, indexes=taken)
    served = list(first) + taken
    while True:
        _, idx = td.get_experience("actor_train", cols, 8, use_batch_seqlen_balance=True)
        if not idx:
            break
        served += idx
    if len(served) != len(set(served)):
        bad.append("a row was served twice after rows were taken outside the plan")

    # bounded wait
    td = cls(2, 2, metric_cls(), max_wait=0.5, timeout=0.2, timeout_interval=0.2,
             **upstream_dock_kwargs(cls, 2))
    start = time.time()
    try:
        td._wait_for_data("advantages", [0, 1])
        bad.append("_wait_for_data returned for rows that never became ready")
    except TimeoutError:
        if time.time() - start > 5:
            bad.append("TimeoutError came late")
    record("dock: partial pools, stale plans, metrics", not bad,
           "exact shares with a non-multiple pool, no re-served rows, metrics, TimeoutError after max_wait"
           if not bad else "; ".join(bad))


@check("transfer queue manager plan matches ours")
def check_tq(specs, ours):
    import torch
    from mindspeed_rl.utils.metrics import Metric
    tq_mod = importlib.import_module("mindspeed_rl.utils.transfer_queue.tq_mgr")
    cls = getattr(tq_mod.TransferQueueManager, "__ray_actor_class__", tq_mod.TransferQueueManager)
    bad, notes = [], []
    for spec in specs:
        groups, n, dp = spec["groups"], spec["n"], spec["dp"]
        mgr = cls.__new__(cls)  # no shards: lengths come from the table below
        mgr.nums_tq_data, mgr.topics, mgr.data_actors, mgr.data_endpoints = 1, {}, [], ["shard0"]
        mgr.batch_seqlen_balance_mapper = {c: ["prompt_length", "response_length"]
                                           for c in ("ref_log_prob", "actor_log_prob", "reward_scores",
                                                     "actor_train")}
        mgr.balance_planners = {}
        lengths = {
            "prompt_length": [spec["prompts"][r // n] for r in range(groups * n)],
            "response_length": [spec["responses"][r // n][r % n] for r in range(groups * n)],
        }
        mgr._fetch_column_values = lambda topic, column, idx: [torch.tensor([lengths[column][i]]) for i in idx]
        columns = ["prompts", "prompt_length", "responses", "response_length"]
        mgr.add_topic("t", groups, n, columns, ["actor_train", "ref_log_prob"], 30.0, Metric(), 1, groups)
        mgr.update_data_status("t", list(range(groups * n)), columns)
        for consumer, per_group in (("actor_train", True), ("ref_log_prob", False)):
            served = []
            for _ in range(dp):
                alloc = mgr.allocate_shard_and_indexes("t", consumer, False, ["prompts", "responses"],
                                                       groups * n // dp, per_group, True)
                served.append(sorted(i for idxs in alloc.values() for i in idxs) if alloc else None)
            if served != [sorted(s) for s in ours["dock"][spec["name"]][consumer]["served"]]:
                bad.append(f"{spec['name']}/{consumer}: shares differ from ours")
        notes.append(spec["name"])
    record("transfer queue manager plan matches ours", not bad,
           f"same shares as our dock for {notes}" if not bad else "; ".join(bad))


# ---------------------------------------------------------------- main


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("upstream_dir")
    parser.add_argument("--ours", default=OURS_DEFAULT, help="our repository (default: %(default)s)")
    args = parser.parse_args()
    updir = os.path.abspath(args.upstream_dir)
    if not os.path.isdir(os.path.join(updir, "mindspeed_rl")):
        print(f"verify_patched: {updir} has no mindspeed_rl/ package", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(args.ours, "mindspeed_rl", "utils", "seqlen_balancing.py")):
        print(f"verify_patched: {args.ours} is not our repository (see --ours)", file=sys.stderr)
        return 2
    try:
        head = subprocess.run(["git", "-C", updir, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        head = ""
    print(f"upstream: {updir}" + (f" (HEAD {head})" if head else ""))
    print(f"ours:     {args.ours}")

    if not os.path.isfile(os.path.join(updir, "mindspeed_rl", "utils", "partition_refine.py")):
        record("patch series applied", False, "mindspeed_rl/utils/partition_refine.py is missing: "
                                               "run patches/apply.sh first")
        return summary()
    record("patch series applied", True)

    setup_upstream(updir)
    sb = importlib.import_module("mindspeed_rl.utils.seqlen_balancing")
    record("import mindspeed_rl.utils.seqlen_balancing", sb.__file__.startswith(updir), sb.__file__)
    td_mod = importlib.import_module("mindspeed_rl.trainer.utils.transfer_dock")
    metric_cls = importlib.import_module("mindspeed_rl.utils.metrics").Metric
    record("import mindspeed_rl.trainer.utils.transfer_dock", td_mod.__file__.startswith(updir), td_mod.__file__)

    cases, specs = balancer_cases(), dock_specs()
    ours = run_ours(os.path.abspath(args.ours), {"balancer": cases, "dock": specs})

    check_balancer(sb, cases, ours)
    check_micro(sb)
    check_dist(updir)
    check_dock_round(td_mod, metric_cls, specs, ours)
    check_dock_edges(td_mod, metric_cls)
    if os.path.isfile(os.path.join(updir, "mindspeed_rl", "utils", "transfer_queue", "tq_mgr.py")):
        check_tq(specs, ours)
    print(f"stand-ins used for missing third-party modules: {', '.join(STUBBED) or 'none'}")
    return summary()


def summary():
    failed = [name for name, ok, _ in RESULTS if not ok]
    print()
    print(f"SUMMARY: {len(RESULTS) - len(failed)} passed, {len(failed)} failed"
          + (f" ({', '.join(failed)})" if failed else ""))
    print("PASS" if not failed else "FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
