"""BaseWorker in this process, no Ray: what the constructor refuses, the rendezvous address, a one-rank
process group, and run_stage's split of the received rows into this rank's shares."""
import dataclasses
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from transformers.utils import logging as hf_logging

import mindspeed_rl.workers.base_worker as bw
from mindspeed_rl.config_cls import RLConfig
from mindspeed_rl.plan.run_plan import Layout, RunPlan, StagePlan, Timeouts
from mindspeed_rl.plan.stages import OLD, REF, REWARD
from mindspeed_rl.trainer.stage_runner import StageGroup, StageRef
from mindspeed_rl.data.columnar import ColumnBatch
from mindspeed_rl.workers.parallel_state import ParallelState


def _plan(world=2, tp=1, engine="ddp", shares=2):
    """Two DP stages (reference and old log-probs) of ``shares`` shares per DP rank."""
    stages = {s.name: StagePlan(s.name, 2, shares, False, stage=s, inputs=("prompts", "responses"))
              for s in (REF, OLD)}
    return RunPlan(Layout(world, world // tp, tp, engine=engine), prompts_per_round=1, n_samples=1,
                   mini_batch_rows=1, epochs=1, train_iters=1, stages=stages,
                   timeouts=Timeouts(30.0, 77.0, 30.0))


@pytest.fixture
def threads():
    """torch's thread count is process-wide: put it back after the test."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------ the constructor

@pytest.mark.parametrize("bad, kind", [(None, "NoneType"), (object(), "object")])
def test_a_worker_without_a_run_plan_names_what_it_got(bad, kind):
    with pytest.raises(ValueError) as info:
        bw.BaseWorker(rank=0, world_size=2, run_plan=bad)
    assert str(info.value) == f"BaseWorker needs the run_plan (config_cls.RunPlan) of the run, got {kind}"


def test_config_objects_are_refused_by_name_in_order():
    with pytest.raises(TypeError) as info:
        bw.BaseWorker(rank=0, world_size=2, run_plan=_plan(), rl_config=RLConfig({}), a_config=RLConfig({}),
                      note="plain values pass")
    assert str(info.value) == ("BaseWorker takes no config objects (got ['a_config', 'rl_config']); put what the "
                               "worker reads in the run plan's worker spec (plan.worker_spec)")


def test_world_size_must_match_the_layout():
    with pytest.raises(ValueError) as info:
        bw.BaseWorker(rank=0, world_size=3, run_plan=_plan(world=2))
    assert str(info.value) == "world_size 3 disagrees with the run plan's 2"


def test_a_cpu_worker_takes_its_thread_count_from_the_environment(monkeypatch, threads):
    hf_logging.enable_progress_bar()
    monkeypatch.setenv("MSRL_THREADS_PER_WORKER", "3")
    plan = _plan()
    w = bw.BaseWorker(rank=1, world_size=2, run_plan=plan, note="kept out of the worker")
    assert (w.rank, w.world_size, w.run_plan, w.parallel_state) == (1, 2, plan, None)
    assert w.device.type == "cpu" and torch.get_num_threads() == 3
    assert not hf_logging.is_progress_bar_enabled()  # no download bars in the workers' logs
    monkeypatch.setenv("MSRL_THREADS_PER_WORKER", "0")  # at least one thread
    bw.BaseWorker(rank=0, world_size=2, run_plan=plan)
    assert torch.get_num_threads() == 1
    monkeypatch.delenv("MSRL_THREADS_PER_WORKER")
    torch.set_num_threads(2)
    bw.BaseWorker(rank=0, world_size=2, run_plan=plan)
    assert torch.get_num_threads() == 1  # the default is one thread per worker


def test_the_device_follows_local_rank(monkeypatch):
    asked = []
    monkeypatch.setattr(bw, "get_device", lambda local_rank: asked.append(local_rank) or torch.device("meta"))
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert bw.BaseWorker(rank=0, world_size=2, run_plan=_plan()).device == torch.device("meta")
    monkeypatch.delenv("LOCAL_RANK")
    bw.BaseWorker(rank=0, world_size=2, run_plan=_plan())
    assert asked == [5, 0]


# ------------------------------------------------------------------ rendezvous and process group

def _free(addr, port):
    with socket.socket() as sock:
        sock.bind((addr, port))  # raises when the port is taken
        return True


def listening(port):
    """The local addresses a socket listens on at ``port`` (from /proc/net/tcp and tcp6: state 0A)."""
    found = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                host, hexport = local.split(":")
                if state == "0A" and int(hexport, 16) == port:
                    found.add("127.0.0.1" if host == "0100007F" else "127.0.0.2" if host == "0200007F" else host)
    return found


def test_master_address_is_loopback_outside_ray(monkeypatch):
    monkeypatch.setattr(bw.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(bw.ray.util, "get_node_ip_address", lambda: "127.0.0.2")  # not asked outside Ray
    w = bw.BaseWorker(rank=0, world_size=2, run_plan=_plan())
    addr, port = w.get_master_addr_port()
    # a port the OS picked (from its ephemeral range, never a privileged one), held listening on that address
    # alone until the store takes it over, free again once the worker shuts down
    assert addr == "127.0.0.1" and isinstance(port, int) and port >= 1024 and listening(port) == {"127.0.0.1"}
    w.shutdown()
    assert listening(port) == set() and _free(addr, port)


def test_master_address_is_the_nodes_ip_in_a_ray_worker_whatever_its_environment(monkeypatch):
    # a worker a raylet started (ray start on another machine) has no RAY_ADDRESS of the driver's: rank 0's node
    # address is what every rank's init_method must name
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(bw.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(bw.ray.util, "get_node_ip_address", lambda: "127.0.0.2")  # another loopback address
    w = bw.BaseWorker(rank=0, world_size=2, run_plan=_plan())
    addr, port = w.get_master_addr_port()
    assert addr == "127.0.0.2" and port >= 1024 and listening(port) == {"127.0.0.2"}
    w.shutdown()


@pytest.mark.parametrize("engine, mesh", [("ddp", []), ("fsdp", ["cpu"])])
def test_init_distributed_joins_the_group_with_the_plans_backend_and_timeout(monkeypatch, engine, mesh):
    calls, meshes = [], []
    real = dist.init_process_group
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append((a, k)) or real(*a, **k))
    monkeypatch.setattr(ParallelState, "build_mesh", lambda self, device_type: meshes.append(device_type) or self)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    w = bw.BaseWorker(rank=0, world_size=1, run_plan=_plan(world=1, engine=engine))
    w.init_transfer_dock("an upstream dock handle")
    addr, port = w.get_master_addr_port()
    try:
        assert w.init_distributed(addr, port) == 0
        assert dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() == 1
        assert listening(port) == {"127.0.0.1"}  # the store serves on the rendezvous socket: loopback only
        ps = w.parallel_state
        assert (ps.rank, ps.world_size, ps.tp_size) == (0, 1, 1) and ps.dp_group is not None
        assert ps.tp_group is not None and w.is_tp_src
    finally:
        w.shutdown()
    ((args, kwargs),) = calls
    store = kwargs.pop("store")
    assert args == ("gloo",) and kwargs == dict(rank=0, world_size=1, timeout=timedelta(seconds=77.0))
    assert isinstance(store, dist.TCPStore) and (store.host, store.port) == (addr, port)
    assert meshes == mesh  # ddp replicas need no device mesh
    assert not dist.is_initialized() and w.td is None


@pytest.mark.parametrize("device, asked, backend", [("cuda", "gloo", "gloo"), ("cuda", "nccl", "nccl"),
                                                    ("cpu", "nccl", "gloo")])
def test_the_backend_is_the_spec_s_when_the_device_runs_it(monkeypatch, device, asked, backend):
    calls = []
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: calls.append(a[0]))
    monkeypatch.setattr(ParallelState, "build_groups", lambda self: self)  # no process group was made
    plan = _plan(world=1)
    engine = dataclasses.replace(plan.worker.engine, distributed_backend=asked)
    plan = dataclasses.replace(plan, worker=dataclasses.replace(plan.worker, engine=engine))
    w = bw.BaseWorker(rank=0, world_size=1, run_plan=plan)
    w.device = torch.device(device)  # what a rank on an accelerator gets
    w.init_distributed("127.0.0.1", 1234)
    assert calls == [backend]


def test_shutdown_without_a_process_group_drops_the_dock_handle():
    w = bw.BaseWorker(rank=0, world_size=2, run_plan=_plan())
    w.init_transfer_dock("handle")
    w.shutdown()
    assert w.td is None and not dist.is_initialized()


# ------------------------------------------------------------------ run_stage

class Recorder(bw.BaseWorker):
    """Stage methods that record what they get and return one output per row."""

    def compute_ref_log_prob(self, batches, shares, **context):
        self.seen = [(dict(b), s, context) for b, s in zip(batches, shares)]
        rows = [r for s in shares for r in s]
        return {"ref/rows": float(len(rows))}, {"ref_log_prob": [torch.full((2,), float(r)) for r in rows]}

    def compute_log_prob(self, batches, shares, **context):
        return {"old/shares": float(len(shares))}, self.old_output


def _worker(rank=0, world=2, tp=1, old_output=None, shares=2):
    w = Recorder(rank=rank, world_size=world, run_plan=_plan(world, tp, shares=shares))
    w.parallel_state = ParallelState.from_layout(rank, w.run_plan.layout)
    w.old_output = old_output
    return w


def _rows(ids):
    return {"prompts": [torch.tensor([i, i]) for i in ids], "responses": [torch.tensor([10 * i]) for i in ids],
            "labels": [torch.tensor([i]) for i in ids]}


def test_each_share_gets_its_own_rows_and_columns():
    w = _worker(rank=1)  # DP rank 1: its shares are plan[1]
    plan = [[[0], [1, 2]], [[3, 4, 5], [6]]]
    metrics, out = w.run_stage(StageGroup.of(w.run_plan.stages[REF.name]), plan, _rows([3, 4, 5, 6]), iteration=4)
    assert metrics == {"ref/rows": 4.0}
    # the received rows are cut by share length, and only the stage's input columns travel on
    assert [s for _, s, _ in w.seen] == [[3, 4, 5], [6]]
    assert [sorted(b) for b, _, _ in w.seen] == [["prompts", "responses"]] * 2
    assert [[int(t[0]) for t in b["prompts"]] for b, _, _ in w.seen] == [[3, 4, 5], [6]]
    assert [[int(t) for t in b["responses"]] for b, _, _ in w.seen] == [[30, 40, 50], [60]]
    assert all(c == {"iteration": 4} for _, _, c in w.seen)
    assert isinstance(out, ColumnBatch) and [float(t[0]) for t in out["ref_log_prob"]] == [3.0, 4.0, 5.0, 6.0]


def test_three_shares_are_cut_one_after_the_other():
    w = _worker(shares=3)
    w.run_stage(StageGroup.of(w.run_plan.stages[REF.name]), [[[0], [1, 2], [3]], [[4], [5], [6]]], _rows([0, 1, 2, 3]))
    assert [[int(t[0]) for t in b["prompts"]] for b, _, _ in w.seen] == [[0], [1, 2], [3]]


def test_a_plan_that_does_not_fit_the_layout_is_refused_with_the_rank():
    w = _worker(rank=1)
    with pytest.raises(ValueError) as info:
        w.run_stage(StageGroup.of(w.run_plan.stages[REF.name]), [[[0], [1]]], _rows([0, 1]))
    assert str(info.value) == "rank 1: stage 'ref_log_prob' plan has 1 DP ranks, the layout 2"


def test_a_group_merges_the_metrics_and_outputs_of_its_stages():
    w = _worker(old_output={"old_log_prob": [torch.ones(1)] * 2})
    group = StageGroup.of(*(w.run_plan.stages[n] for n in (REF.name, OLD.name)))
    metrics, out = w.run_stage(group, [[[0], [1]], [[2], [3]]], ColumnBatch(_rows([0, 1])))
    assert metrics == {"ref/rows": 2.0, "old/shares": 2.0}
    assert sorted(out) == ["old_log_prob", "ref_log_prob"] and len(out["old_log_prob"]) == 2


def test_a_stage_that_writes_nothing_returns_no_output():
    w = _worker(old_output=None)
    metrics, out = w.run_stage(StageGroup.of(w.run_plan.stages[OLD.name]), [[[0], [1]], [[2], [3]]], _rows([0, 1]))
    assert metrics == {"old/shares": 2.0} and out is None
    w.old_output = {}
    assert w.run_stage(StageGroup.of(w.run_plan.stages[OLD.name]), [[[0], [1]], [[2], [3]]], _rows([0, 1]))[1] is None


def test_only_the_tp_source_returns_outputs():
    plan = [[[0], [1]], [[2], [3]]]
    for rank, keeps in ((2, True), (3, False)):  # world 4, TP 2: ranks 2 and 3 are DP rank 1
        w = _worker(rank=rank, world=4, tp=2)
        metrics, out = w.run_stage(StageGroup.of(w.run_plan.stages[REF.name]), plan, _rows([2, 3]))
        assert w.is_tp_src is keeps and metrics == {"ref/rows": 2.0}
        assert (out is not None) is keeps
        assert [s for _, s, _ in w.seen] == [[2], [3]]


def test_a_stage_the_plan_lacks_or_runs_in_the_driver_is_refused_with_the_rank():
    w = _worker(rank=1)
    driver = StagePlan(REWARD.name, 2, 2, False, stage=REWARD)
    w.run_plan = dataclasses.replace(w.run_plan, stages={**w.run_plan.stages, REWARD.name: driver})
    for name in (REWARD.name, "ghost"):
        ref = StageRef(name, (), ())  # what a rank receives of a stage group
        with pytest.raises(ValueError) as info:
            w.run_stage(StageGroup.of(ref), [[[0], [1]], [[2], [3]]], _rows([2, 3]))
        assert str(info.value) == f"rank 1: the run plan has no DP stage '{name}'"
