"""RayActorGroup in this process: Ray's calls the launcher makes are replaced by a fake that runs each
rank's worker object here and hands back finished (or failed, or never finishing) results. What is
checked: the actor options per accelerator, the start sequence, results in rank order, the one error a
failing or silent rank ends a command with, the pick of the root cause, and the teardown.
The real Ray runs in test_launcher.py and test_worker_faults.py."""
import dataclasses
from types import SimpleNamespace

import pytest
import ray

from mindspeed_rl.plan.rollout_spec import RolloutSpec
from mindspeed_rl.plan.run_plan import Layout, RunPlan, StagePlan, Timeouts
from mindspeed_rl.plan.stages import TRAIN
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.data.driver_dock import QueueRound
from mindspeed_rl.workers.base_worker import BaseWorker
from mindspeed_rl.workers.scheduler import launcher

NEVER = object()  # a result that never arrives


class Ref:
    """An object ref: a value, an error, or NEVER."""

    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def __repr__(self):
        return f"Ref({self.value!r}, {self.error!r})"


class FakeRay:
    """The part of Ray the launcher calls; records what it was asked."""

    def __init__(self, resources=None, nodes=1, node_id="node-A"):
        self.resources = {"CPU": 8.0} if resources is None else resources
        self.node_list = [{"Alive": True, "Resources": dict(self.resources)}] * nodes + [{"Alive": False}]
        self.node_id = node_id
        self.killed, self.removed, self.groups, self.options, self.waits, self.put = [], [], [], [], [], []
        self.ready = True
        self.current = None  # the rank whose task runs now (its node id, its pid)
        self.get_timeouts = []

    def install(self, monkeypatch):
        fake = self
        monkeypatch.setattr(ray, "cluster_resources", lambda: dict(fake.resources))
        monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 1.5})
        monkeypatch.setattr(ray, "nodes", lambda: list(fake.node_list))
        monkeypatch.setattr(ray, "get_runtime_context", lambda: type("Context", (), {
            "get_node_id": lambda self: fake.node_id if fake.current is None else f"node-{fake.current}"})())
        real_getpid = launcher.os.getpid  # a rank's pid inside its task, this process's elsewhere
        monkeypatch.setattr(launcher.os, "getpid", lambda: real_getpid() if fake.current is None else 100 + fake.current)
        monkeypatch.setattr(ray, "wait", fake.wait)
        monkeypatch.setattr(ray, "get", fake.get)
        monkeypatch.setattr(ray, "kill", fake.kill)
        monkeypatch.setattr(ray, "put", lambda value: fake.put.append(value) or ("put", len(fake.put) - 1))
        monkeypatch.setattr(ray, "remote", fake.remote)
        monkeypatch.setattr(launcher, "placement_group", fake.placement_group)
        monkeypatch.setattr(launcher, "remove_placement_group", fake.removed.append)
        monkeypatch.setattr(launcher, "PlacementGroupSchedulingStrategy",
                            lambda group, placement_group_bundle_index: ("bundle", group, placement_group_bundle_index))
        monkeypatch.setattr(launcher, "NodeAffinitySchedulingStrategy", lambda node_id, soft: ("node", node_id, soft))
        return self

    def placement_group(self, bundles, strategy):
        group = type("Group", (), {"ready": lambda s: Ref("ready" if self.ready else NEVER)})()
        group.bundles, group.strategy = bundles, strategy
        self.groups.append(group)
        return group

    def wait(self, pending, num_returns=1, timeout=None):
        if not 0 < num_returns <= len(pending):  # as Ray refuses them
            raise ValueError(f"Invalid number of objects to return {num_returns}.")
        self.waits.append((len(pending), num_returns, timeout))
        done = [r for r in pending if r.value is not NEVER][:num_returns]
        return done, [r for r in pending if r not in done]

    def get(self, ref, timeout=None):
        self.get_timeouts.append(timeout)
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref.value is NEVER:
            raise ray.exceptions.GetTimeoutError("timed out")
        if ref.error is not None:
            raise ref.error
        return ref.value

    def kill(self, actor, no_restart=False):
        assert no_restart
        self.killed.append(actor.rank)
        if actor.gone:
            raise ValueError("actor already gone")

    def remote(self, worker):
        fake = self

        class Remote:
            @staticmethod
            def options(**options):
                fake.options.append(options)
                return type("Builder", (), {"remote": staticmethod(lambda **kw: Actor.start(worker, kw, fake))})()
        return Remote


class Actor:
    """An actor handle over a worker object in this process: ``handle.method.remote(...)`` runs it now."""

    def __init__(self, obj, fake, rank=None, error=None):
        self.obj, self.gone, self.fake, self.error = obj, False, fake, error
        self.rank = rank if obj is None else getattr(obj, "rank", "queue")

    @classmethod
    def start(cls, worker, kwargs, fake):
        """As Ray does: a constructor's error comes back from every call on the actor."""
        try:
            return cls(worker(**kwargs), fake)
        except Exception as err:  # noqa: BLE001
            return cls(None, fake, rank=kwargs["rank"], error=err)

    def __getattr__(self, name):
        if name == "__ray_call__":  # runs a function on the actor (the launcher asks for its pid and node)
            method = lambda fn: fn(self.obj)  # noqa: E731
        elif self.obj is None:
            method = None
        else:
            method = getattr(self.obj, name)

        def run(*args, **kwargs):
            if self.error is not None:
                return Ref(error=self.error)
            self.fake.current = self.rank
            try:
                return Ref(method(*args, **kwargs))
            except Exception as err:  # noqa: BLE001  (what Ray hands back for a failed task)
                return Ref(error=err)
            finally:
                self.fake.current = None
        return type("Method", (), {"remote": staticmethod(run)})()


class Worker(BaseWorker):
    """A rank: records its start; ``step`` answers, fails or never answers as the test asks;
    ``fail_in``: a start step where rank 1 fails."""

    def __init__(self, rank, world_size, run_plan, fail_in=None, **kwargs):
        super().__init__(rank, world_size, run_plan, **kwargs)
        self.fail_in, self.extra = fail_in, kwargs

    def _start_step(self, name):
        if self.fail_in == name and self.rank == 1:
            raise OSError(f"rank 1 cannot {name}")

    def init_distributed(self, master_addr, master_port):
        self._start_step("init_distributed")
        self.master = (master_addr, master_port)
        return self.rank

    def get_master_addr_port(self):
        self._start_step("get_master_addr_port")
        return f"10.0.0.{self.rank}", 4000 + self.rank

    def step(self, x=0, behaviour=None):
        what = (behaviour or {}).get(self.rank)
        if isinstance(what, BaseException):
            raise what
        return NEVER if what == "silent" else (self.rank, x)

    def shutdown(self):
        self.stopped = True
        return self.rank


def _plan(world=2, tp=1, stage=None, placement="auto", place_s=30.0, resources=()):
    return RunPlan(Layout(world, world // tp, tp, resources=resources), prompts_per_round=1, n_samples=1, mini_batch_rows=1, epochs=1,
                   train_iters=1, timeouts=Timeouts(20.0, 40.0, place_s, stage=stage), placement=placement)


def _group(monkeypatch, fake=None, plan=None, **kwargs):
    fake = (fake or FakeRay()).install(monkeypatch)
    return launcher.RayActorGroup(Worker, plan or _plan(), **kwargs), fake


# ------------------------------------------------------------------ start

def test_start_places_one_bundle_per_rank_and_wires_the_ranks(monkeypatch):
    group, fake = _group(monkeypatch, plan=_plan(world=4, tp=2, stage=5.0, place_s=50.0), extra="passed on")
    assert group.world_size == 4 and group.stage_timeout == 5.0 and group.strategy == "PACK" and group.worker is Worker
    (pg,) = fake.groups
    assert pg.bundles == [{"CPU": 0.5}] * 4 and pg.strategy == "PACK"  # no accelerator: half a CPU each
    assert fake.options == [dict(num_cpus=0.5, scheduling_strategy=("bundle", pg, rank)) for rank in range(4)]
    workers = [a.obj for a in group.actors]
    assert [w.rank for w in workers] == [0, 1, 2, 3] and all(w.world_size == 4 for w in workers)
    assert all(w.extra == {"extra": "passed on"} for w in workers)
    assert all(w.master == ("10.0.0.0", 4000) for w in workers)  # rank 0's address, for every rank
    assert group.pids == [(100 + r, f"node-{r}") for r in range(4)]
    assert [(s.dp_rank, s.tp_rank) for s in group.states] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # starting is bounded by the larger of the stage deadline and the placement timeout (which also
    # bounds the placement group's start): pids and nodes (4 ranks), the address (rank 0), the process group
    assert [w[:2] for w in fake.waits] == [(4, 1), (3, 1), (2, 1), (1, 1), (1, 1), (4, 1), (3, 1), (2, 1), (1, 1)]
    assert all(w[2] == pytest.approx(50.0, abs=1) for w in fake.waits) and fake.get_timeouts[0] == 50.0
    group, fake = _group(monkeypatch, plan=_plan(world=2, stage=80.0, place_s=50.0))
    assert len(fake.waits) == 2 + 1 + 2 and all(w[2] == pytest.approx(80.0, abs=1) for w in fake.waits)


@pytest.mark.parametrize("accel, options", [
    ("GPU", dict(num_cpus=1, num_gpus=1)),
    ("NPU", dict(num_cpus=1, resources={"NPU": 1})),
])
def test_a_rank_takes_one_accelerator_and_one_cpu(monkeypatch, accel, options):
    group, fake = _group(monkeypatch, FakeRay({"CPU": 8.0, accel: 2.0, "GPU" if accel == "NPU" else "x": 0.5}))
    assert fake.groups[0].bundles == [{"CPU": 1, accel: 1}] * 2
    for rank, got in enumerate(fake.options):
        assert got == dict(options, scheduling_strategy=("bundle", fake.groups[0], rank))


def test_the_cpu_count_per_worker_can_be_set(monkeypatch):
    group, fake = _group(monkeypatch, FakeRay({"CPU": 8.0, "GPU": 2.0}), num_cpus_per_worker=0.25)
    assert fake.groups[0].bundles == [{"CPU": 0.25, "GPU": 1}] * 2 and fake.options[0]["num_cpus"] == 0.25


def test_custom_resources_go_into_every_ranks_bundle_and_a_missing_one_is_named(monkeypatch):
    group, fake = _group(monkeypatch, FakeRay({"CPU": 8.0, "node_b": 2.0}), plan=_plan(resources=(("node_b", 1.0),)))
    assert fake.groups[0].bundles == [{"CPU": 0.5, "node_b": 1.0}] * 2  # the bundle's node is one that offers it
    assert fake.options[0] == dict(num_cpus=0.5, scheduling_strategy=("bundle", fake.groups[0], 0))
    with pytest.raises(launcher.PlacementError) as info:
        _group(monkeypatch, FakeRay({"CPU": 8.0, "node_b": 1.0}), plan=_plan(resources=(("node_b", 1.0),)))
    assert str(info.value) == (
        "cannot place the workers: the run asks for 2 workers x {CPU: 0.5, node_b: 1} = {CPU: 1, node_b: 2}; the "
        "cluster has {CPU: 8, node_b: 1} on 1 node(s) (rl_config.actor_resource.num_npus sets the worker count; "
        "custom_resources under it, the Ray resources each worker asks for)")


def test_the_stage_deadline_defaults_to_the_plans(monkeypatch):
    group, _ = _group(monkeypatch, plan=_plan(stage=None))
    assert group.stage_timeout == 20.0  # td_timeout
    group, _ = _group(monkeypatch, stage_timeout=3.0)
    assert group.stage_timeout == 3.0


def test_auto_placement_spreads_over_the_live_nodes(monkeypatch):
    group, fake = _group(monkeypatch, FakeRay(nodes=2))
    assert group.strategy == "SPREAD" and fake.groups[0].strategy == "SPREAD"


def test_a_rank_failing_to_join_the_process_group_is_named_with_the_step(monkeypatch):
    fake = FakeRay().install(monkeypatch)
    with pytest.raises(RuntimeError) as info:
        launcher.RayActorGroup(Worker, _plan(world=2), fail_in="init_distributed")
    assert str(info.value) == "worker rank 1 failed in 'init_distributed': OSError: rank 1 cannot init_distributed"
    assert fake.removed == fake.groups and fake.killed == [0, 1]


def test_a_rank_whose_worker_cannot_be_built_fails_the_start(monkeypatch):
    class Broken(Worker):
        def __init__(self, rank, **kwargs):
            if rank == 1:
                raise ImportError("no module named 'flash_attn'")
            super().__init__(rank, **kwargs)

    fake = FakeRay().install(monkeypatch)
    with pytest.raises(RuntimeError) as info:
        launcher.RayActorGroup(Broken, _plan(world=2))
    assert str(info.value) == "worker rank 1 failed in 'start': ImportError: no module named 'flash_attn'"
    assert fake.killed == [0, 1] and fake.removed == fake.groups


def test_the_address_is_asked_of_rank_zero_and_its_failure_named(monkeypatch):
    class Rank0Fails(Worker):
        def get_master_addr_port(self):
            raise OSError("no free port")

    fake = FakeRay().install(monkeypatch)
    with pytest.raises(RuntimeError) as info:
        launcher.RayActorGroup(Rank0Fails, _plan(world=2))
    assert str(info.value) == "worker rank 0 failed in 'get_master_addr_port': OSError: no free port"


def test_a_rank_silent_at_start_is_named_under_worker_start_with_its_step(monkeypatch):
    class Slow(Worker):
        def init_distributed(self, master_addr, master_port):
            return NEVER if self.rank == 1 else self.rank

    fake = FakeRay().install(monkeypatch)
    with pytest.raises(launcher.StageTimeoutError) as info:
        launcher.RayActorGroup(Slow, _plan(world=2, stage=3.0, place_s=12.0))
    assert str(info.value) == ("'init_distributed' did not finish within 12s (worker start): rank 1 (pid 101) did "
                               "not answer, rank(s) [0] finished; the run stops")


def test_a_strict_placement_the_nodes_cannot_hold_is_refused(monkeypatch):
    fake = FakeRay({"CPU": 8.0})
    with pytest.raises(launcher.PlacementError) as info:
        _group(monkeypatch, fake, plan=_plan(world=2, placement="STRICT_SPREAD"))
    assert str(info.value) == ("cannot place the workers: placement STRICT_SPREAD puts each of 2 workers on its own "
                               "node; the cluster has 1 (rl_config.actor_resource.num_npus sets the worker count)")
    assert fake.groups == []


def test_a_placement_group_that_never_becomes_ready_is_removed_and_named(monkeypatch):
    fake = FakeRay({"CPU": 8.0})
    fake.ready = False
    with pytest.raises(launcher.PlacementError) as info:
        _group(monkeypatch, fake, plan=_plan(world=4, place_s=7.5))
    assert fake.removed == fake.groups and len(fake.groups) == 1
    assert str(info.value) == ("cannot place the workers within 7.5s: the run asks for 4 workers x {CPU: 0.5} "
                               "(PACK); the cluster has {CPU: 1.5} free now on 1 node(s) (other jobs hold the "
                               "rest?) (rl_config.actor_resource.num_npus sets the worker count)")
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert fake.get_timeouts == [7.5]  # the placement timeout bounds the wait for the group


def test_the_free_resources_named_include_those_the_cluster_has_none_of_free(monkeypatch):
    fake = FakeRay({"CPU": 8.0, "GPU": 4.0})
    fake.ready = False
    with pytest.raises(launcher.PlacementError, match=r"the cluster has \{CPU: 1\.5, GPU: 0\} free now"):
        _group(monkeypatch, fake)


def test_too_few_resources_are_refused_before_asking_ray(monkeypatch):
    fake = FakeRay({"CPU": 1.0})
    with pytest.raises(launcher.PlacementError) as info:
        _group(monkeypatch, fake, plan=_plan(world=4))
    assert fake.groups == []
    assert str(info.value) == ("cannot place the workers: the run asks for 4 workers x {CPU: 0.5} = {CPU: 2}; the "
                               "cluster has {CPU: 1} on 1 node(s) (rl_config.actor_resource.num_npus sets the "
                               "worker count)")


# ------------------------------------------------------------------ commands

def test_results_come_in_rank_order(monkeypatch):
    group, fake = _group(monkeypatch, plan=_plan(world=3))
    assert group.execute_sync_command("step", 7) == [(0, 7), (1, 7), (2, 7)]
    assert group.execute_sync_command("step", x=2) == [(0, 2), (1, 2), (2, 2)]
    assert fake.waits[-1] == (1, 1, pytest.approx(20.0, abs=1))  # the stage deadline, counting down


def test_a_failing_rank_ends_the_command_with_its_error_and_tears_down(monkeypatch):
    group, fake = _group(monkeypatch, plan=_plan(world=3))
    pg = group.placement_group
    with pytest.raises(RuntimeError) as info:
        group.execute_sync_command("step", behaviour={1: ValueError("bad row 4")})
    assert str(info.value) == "worker rank 1 failed in 'step': ValueError: bad row 4"
    assert isinstance(info.value.__cause__, ValueError)
    assert group.actors == [] and group.placement_group is None
    assert fake.killed == [0, 1, 2] and fake.removed == [pg]


def test_the_last_rank_failing_leaves_nobody_to_wait_for(monkeypatch):
    group, fake = _group(monkeypatch, plan=_plan(world=3))
    with pytest.raises(RuntimeError) as info:
        group.execute_sync_command("step", behaviour={2: ValueError("last")})
    assert str(info.value) == "worker rank 2 failed in 'step': ValueError: last"


def test_without_a_stage_deadline_commands_wait_as_long_as_they_take(monkeypatch):
    plan = RunPlan(Layout(2, 2, 1), prompts_per_round=1, n_samples=1, mini_batch_rows=1, epochs=1, train_iters=1,
                   timeouts=Timeouts(None, 40.0, 30.0))
    group, fake = _group(monkeypatch, plan=plan)
    assert group.stage_timeout is None
    assert group.execute_sync_command("step") == [(0, 0), (1, 0)]
    assert fake.waits[-2:] == [(2, 1, None), (1, 1, None)]


def test_a_passed_deadline_waits_no_longer(monkeypatch):
    group, fake = _group(monkeypatch, plan=_plan(world=2, stage=5.0))
    clock = iter(range(0, 1000, 10))  # ten seconds pass between two looks at the clock
    monkeypatch.setattr(launcher.time, "monotonic", lambda: next(clock))
    with pytest.raises(launcher.StageTimeoutError):
        group.execute_sync_command("step", behaviour={1: "silent"})
    assert fake.waits[-2:] == [(2, 1, 0.0), (1, 1, 0.0)]  # the deadline had passed before each look


def test_ranks_that_stay_silent_after_a_failure_are_named(monkeypatch):
    group, fake = _group(monkeypatch, plan=_plan(world=3))
    with pytest.raises(RuntimeError) as info:
        group.execute_sync_command("step", behaviour={0: "silent", 1: KeyError("x"), 2: "silent"})
    assert str(info.value) == ("worker rank 1 failed in 'step': KeyError: 'x' (ranks 0, 2 (pid 100; pid 102) did "
                               "not answer either)")
    assert fake.waits[-1] == (2, 2, 3.0)  # the grace for the others: all of them, 3 s


def _dead(pid):
    return type("Dead", (ray.exceptions.RayActorError,),
                {"__str__": lambda self: f"The actor died.\n\tclass_name: Worker\n\tpid: {pid}\n"})()


def test_a_dead_rank_is_reported_before_its_peers_collective_errors(monkeypatch):
    group, _ = _group(monkeypatch, plan=_plan(world=3))
    behaviour = {0: RuntimeError("Gloo connection closed by peer"), 1: _dead(101), 2: RuntimeError("plain")}
    with pytest.raises(RuntimeError) as info:
        group.execute_sync_command("step", behaviour=behaviour)
    assert str(info.value) == "worker rank 1 failed in 'step': actor Worker (pid 101) died (Dead)"


@pytest.mark.parametrize("word", ["gloo", "connection", "nccl", "hccl", "timed out"])
def test_a_ranks_own_error_beats_the_collective_errors_it_causes(monkeypatch, word):
    group, _ = _group(monkeypatch, plan=_plan(world=3))
    behaviour = {0: RuntimeError(f"collective {word.upper()} failure"), 1: RuntimeError("peer lost"),
                 2: ValueError("the rank's own error")}
    with pytest.raises(RuntimeError) as info:
        group.execute_sync_command("step", behaviour=behaviour)
    # rank 1's error has none of the words: it is a cause as much as rank 2's; the lower rank wins
    assert str(info.value) == "worker rank 1 failed in 'step': RuntimeError: peer lost"


def test_among_equal_causes_the_lowest_rank_is_named(monkeypatch):
    group, _ = _group(monkeypatch, plan=_plan(world=3))
    behaviour = {0: RuntimeError("gloo: a"), 1: RuntimeError("own b"), 2: RuntimeError("own c")}
    with pytest.raises(RuntimeError, match=r"^worker rank 1 failed in 'step': RuntimeError: own b$"):
        group.execute_sync_command("step", behaviour=behaviour)
    group, _ = _group(monkeypatch, plan=_plan(world=3))
    behaviour = {0: RuntimeError("gloo: a"), 1: RuntimeError("gloo: b"), 2: RuntimeError("nccl c")}
    with pytest.raises(RuntimeError, match=r"^worker rank 0 failed in 'step': RuntimeError: gloo: a$"):
        group.execute_sync_command("step", behaviour=behaviour)


def test_silent_ranks_are_named_with_their_pids_after_the_deadline(monkeypatch):
    group, fake = _group(monkeypatch, plan=_plan(world=3, stage=2.5))
    with pytest.raises(launcher.StageTimeoutError) as info:
        group.execute_sync_command("step", behaviour={0: "silent", 2: "silent"})
    assert str(info.value) == ("'step' did not finish within 2.5s (rl_config.stage_timeout): ranks 0, 2 "
                               "(pid 100; pid 102) did not answer, rank(s) [1] finished; the run stops")
    assert group.actors == [] and fake.killed == [0, 1, 2]


def test_a_silent_rank_on_this_node_gets_its_process_state(monkeypatch):
    fake = FakeRay(node_id="node-1")  # the driver's node is rank 1's
    group, _ = _group(monkeypatch, fake, plan=_plan(world=2, stage=2.0))
    # rank 0's pid is on another node: a local process with that pid is not rank 0
    monkeypatch.setattr(launcher, "_process_state", lambda pid: {100: "zombie", 101: "stopped"}.get(pid))
    with pytest.raises(launcher.StageTimeoutError) as info:
        group.execute_sync_command("step", behaviour={0: "silent", 1: "silent"})
    assert str(info.value) == ("'step' did not finish within 2s (rl_config.stage_timeout): ranks 0, 1 "
                               "(pid 100; pid 101, stopped) did not answer; the run stops")


def test_a_rank_silent_at_start_is_named_under_worker_start(monkeypatch):
    group, fake = _group(monkeypatch, plan=_plan(world=2, stage=2.0, place_s=9.0))
    group.actors = group.actors + [group.actors[0]]  # a rank whose whereabouts are not known yet
    with pytest.raises(launcher.StageTimeoutError) as info:
        group._wait([Ref(1), Ref(NEVER)], "start", 9.0)
    assert str(info.value) == ("'start' did not finish within 9s (worker start): rank 1 did not answer, "
                               "rank(s) [0] finished; the run stops")


def test_ranks_are_named_plainly_without_their_pids(monkeypatch):
    group, _ = _group(monkeypatch, plan=_plan(world=2))
    assert group._ranks([1]) == "rank 1 (pid 101)"
    assert group._ranks([]) == "ranks "
    assert group._ranks([2]) == "rank 2"  # not a rank of this group
    group.pids = group.pids[:1]
    assert group._ranks([0, 1]) == "ranks 0, 1"


def test_run_stage_sends_each_dp_rank_its_rows_and_keeps_the_tp_sources_outputs(monkeypatch):
    class Stage(Worker):
        def run_stage(self, group, plan, batch, **context):
            if batch == "bad":
                raise ValueError("bad rows")
            return {"rank": self.rank, "batch": batch, "names": group.names, "plan": plan, **context}, \
                f"out {self.rank}"

    fake = FakeRay().install(monkeypatch)
    stage = StageGroup.of(StagePlan("stage_x", 1, 1, False, stage=TRAIN))
    for tp, sent in ((1, ["b0", "b1", "b2", "b3"]), (2, [("put", 0), ("put", 0), ("put", 1), ("put", 1)])):
        fake.put.clear()
        group = launcher.RayActorGroup(Stage, _plan(world=4, tp=tp))
        metrics, outputs = group.run_stage(stage, [[[0]]] * (4 // tp), ["b0", "b1", "b2", "b3"][:4 // tp],
                                           iteration=3)
        # TP peers share one object per DP rank (ray.put once), plain rows otherwise
        assert [m["batch"] for m in metrics] == sent and all(m["iteration"] == 3 for m in metrics)
        assert all(m["names"] == ("stage_x",) and m["plan"] == [[[0]]] * (4 // tp) for m in metrics)
        assert fake.put == (["b0", "b1"] if tp == 2 else [])
        assert outputs == (["out 0", "out 2"] if tp == 2 else ["out 0", "out 1", "out 2", "out 3"])
    group = launcher.RayActorGroup(Stage, _plan(world=4))
    with pytest.raises(RuntimeError, match=r"^worker rank 1 failed in 'stage_x': ValueError: bad rows$"):
        group.run_stage(stage, [[[0]]] * 4, ["b0", "bad", "b2", "b3"])


def test_a_queued_stage_loads_the_groups_queue_and_every_rank_takes_from_it(monkeypatch):
    class Queued(Worker):
        def run_queued_stage(self, group, order, batch, queue, key, **context):
            rows = queue.obj.take(key, self.rank // 2, 0, 8)  # TP peers (ranks 0-1, 2-3) ask as one consumer
            if context.get("iteration") == -1:
                raise ValueError("bad round")
            out = None if self.rank % 2 else f"out {self.rank}"
            return {"rank": self.rank, "batch": batch, "key": key, "names": group.names, "order": order,
                    **context}, out, out and {"rows": rows}

    fake = FakeRay().install(monkeypatch)
    plan = _plan(world=4, tp=2)
    rollout = StagePlan("stage_q", 2, 1, False, stage=TRAIN, queued=True)
    plan = dataclasses.replace(plan, stages={"stage_q": rollout})
    group = launcher.RayActorGroup(Queued, plan)
    stage = StageGroup.of(rollout)
    queued = QueueRound([5, 6, 7, 8], "the round's inputs", [0, 0, 1, 1], [float("nan")] * 4)
    fake.get_timeouts.clear()
    metrics, made = group.run_queued_stage(stage, queued, iteration=4)
    queue = group.queue.obj
    # the queue actor holds no CPU of the workers', on the driver's node
    assert fake.options[-1] == {"num_cpus": 0, "scheduling_strategy": ("node", "node-A", False)}
    assert fake.get_timeouts[0] == 20.0  # loading the queue waits at most the stage deadline
    # one queue of the round: its rows, one consumer per TP group (transformers generate), chunks of rows_per_share
    assert (queue.key, queue.rows, queue.consumers, queue.chunk, queue.cap) == (1, 4, 2, 2, None)
    assert all(m["names"] == ("stage_q",) and m["order"] == [5, 6, 7, 8] for m in metrics)
    # the inputs go into the object store once; every rank gets the same object and the round's key
    assert fake.put == ["the round's inputs"] and [m["batch"] for m in metrics] == [("put", 0)] * 4
    assert [m["key"] for m in metrics] == [1] * 4 and all(m["iteration"] == 4 for m in metrics)
    assert made == [("out 0", {"rows": [0, 1]}), ("out 2", {"rows": [2, 3]})]
    # each engine's first take came with the load and went to every rank
    assert all(m["firsts"] == {0: [0, 1], 1: [2, 3]} for m in metrics)
    assert all(t.left == 0 for t in metrics[0]["firsts"].values())
    group.run_queued_stage(stage, queued._replace(batch="next round"))
    assert group.queue.obj is queue and queue.key == 2  # the next round in the same queue
    fake.killed.clear()
    with pytest.raises(RuntimeError, match=r"^worker rank 0 failed in 'stage_q': ValueError: bad round$"):
        group.run_queued_stage(stage, queued, iteration=-1)
    assert fake.killed == [0, 1, 2, 3, "queue"] and group.queue is None  # the group's end ends its queue
    # vLLM: every rank an engine, continuous takes capped by rows_per_share; the round's groups and prior go along
    spec = dataclasses.replace(plan.worker, rollout=RolloutSpec("vllm", "test"))
    group = launcher.RayActorGroup(Queued, dataclasses.replace(plan, worker=spec))
    group.run_queued_stage(stage, queued._replace(prior=[3.0, 3.0, float("nan"), float("nan")]))
    queue = group.queue.obj
    assert (queue.consumers, queue.chunk, queue.cap) == (4, None, 2)
    assert list(queue.expected()) == [3.0, 3.0]  # two groups; group 0's prior, group 1 at the mean of the known
    assert not queue.handoff
    # free routing of multi-turn rows: the queue is loaded to take turns back
    routed = dataclasses.replace(plan, worker=spec, multi_turn=SimpleNamespace(routing="free"))
    group = launcher.RayActorGroup(Queued, routed)
    group.run_queued_stage(stage, queued)
    assert group.queue.obj.handoff



def test_the_group_commands_return_rank_zeros_answer(monkeypatch):
    class Ckpt(Worker):
        def save_checkpoint(self, folder, with_optimizer, with_rng):
            return (self.rank, folder, with_optimizer, with_rng)

        def load_checkpoint(self, folder, iteration, with_optimizer, with_rng):
            return (self.rank, folder, iteration, with_optimizer, with_rng)

        def export_hf(self, path):
            return (self.rank, path)

        def initialize(self, *args):
            return (self.rank, args)

    FakeRay().install(monkeypatch)
    group = launcher.RayActorGroup(Ckpt, _plan(world=2))
    assert group.save_checkpoint("/c") == (0, "/c", True, True)
    assert group.save_checkpoint("/c", False, False) == (0, "/c", False, False)
    assert group.load_checkpoint("/c", 3) == (0, "/c", 3, True, True)
    assert group.load_checkpoint("/c", 3, False, False) == (0, "/c", 3, False, False)
    assert group.export_hf("/hf") == (0, "/hf")
    assert group.initialize("/m", 1, 2) == [(0, ("/m", 1, 2)), (1, ("/m", 1, 2))]


def test_shutdown_stops_every_rank_then_kills_them_once(monkeypatch):
    group, fake = _group(monkeypatch)
    workers = [a.obj for a in group.actors]
    pg = group.placement_group
    group.actors[1].gone = True  # a rank already gone: its kill fails, the others still go
    group.shutdown()
    assert all(w.stopped for w in workers) and fake.killed == [0, 1] and fake.removed == [pg]
    assert group.actors == [] and group.placement_group is None
    group.shutdown()  # a second shutdown has nothing to stop
    group.kill()
    assert fake.killed == [0, 1] and fake.removed == [pg]


def test_a_failing_shutdown_still_kills_the_ranks(monkeypatch):
    class Stubborn(Worker):
        def shutdown(self):
            raise OSError("cannot close")

    fake = FakeRay().install(monkeypatch)
    group = launcher.RayActorGroup(Stubborn, _plan(world=2))
    with pytest.raises(RuntimeError, match="worker rank 0 failed in 'shutdown': OSError: cannot close"):
        group.shutdown()
    assert group.actors == [] and fake.killed == [0, 1]


# ------------------------------------------------------------------ helpers

def test_accelerator_is_the_first_with_a_whole_device(monkeypatch):
    for resources, want in (({"CPU": 4, "GPU": 1}, "GPU"), ({"NPU": 2, "GPU": 2}, "NPU"),
                            ({"NPU": 0.5, "GPU": 0.5}, None), ({"CPU": 4}, None)):
        monkeypatch.setattr(ray, "cluster_resources", lambda r=resources: dict(r))
        assert launcher._accelerator() == want


def test_only_live_nodes_count(monkeypatch):
    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": True, "id": 1}, {"Alive": False, "id": 2}, {"id": 3}])
    assert launcher._nodes() == [{"Alive": True, "id": 1}]


def test_process_state_reads_proc(tmp_path, monkeypatch):
    import os
    assert launcher._process_state(os.getpid()) is None  # this process is running
    assert launcher._process_state(2 ** 30) is None  # no such process
    real_open = open
    stats = {"7": "7 (a (b) c) T 1 2", "8": "8 (x) Z 1", "9": "9 (x) t", "10": "10 (x) D", "11": "11 (x) X",
             "12": "12 (x) S 1", "13": "13 (x)"}

    def fake_open(path, *args, **kwargs):
        parts = str(path).split("/")
        if len(parts) == 4 and parts[1] == "proc" and parts[2] in stats:
            target = tmp_path / parts[2]
            target.write_text(stats[parts[2]])
            return real_open(target, *args, **kwargs)
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr("builtins.open", fake_open)
    got = {pid: launcher._process_state(int(pid)) for pid in stats}
    assert got == {"7": "stopped", "8": "zombie", "9": "stopped", "10": "in uninterruptible I/O", "11": "dead",
                   "12": None, "13": None}


def test_strict_placements_are_checked_against_the_nodes():
    one = [{"Resources": {"CPU": 2.0}}]
    two = [{"Resources": {"CPU": 2.0}}, {"Resources": {"CPU": 1.0}}]
    assert launcher.placement_shortfall({"CPU": 1.0}, 2, "STRICT_SPREAD", two) is None
    assert launcher.placement_shortfall({"CPU": 1.0}, 2, "STRICT_PACK", two) is None  # the 2-CPU node holds both
    assert launcher.placement_shortfall({"CPU": 1.0}, 2, "STRICT_PACK", one) is None
    assert launcher.placement_shortfall({"CPU": 1.0}, 3, "STRICT_PACK", two) == (
        "placement STRICT_PACK puts all 3 workers x {CPU: 1} on one node; the largest node fits 2")
    assert launcher.placement_shortfall({"CPU": 0.5}, 3, "STRICT_SPREAD", two) == (
        "placement STRICT_SPREAD puts each of 3 workers on its own node; the cluster has 2")
    # a zero entry in the bundle does not limit a node; a node without the resource fits none
    assert launcher.placement_shortfall({"CPU": 1.0, "GPU": 0}, 2, "STRICT_PACK", two) is None
    assert launcher.placement_shortfall({"CPU": 1.0}, 1, "STRICT_PACK", [{"Resources": {}}, *one]) is None
    # a node that lists no resources holds nothing; a resource no node has is short; the largest node must
    # hold every resource of the bundle
    assert launcher.placement_shortfall({"CPU": 1.0}, 1, "STRICT_PACK", [{}, *one]) is None
    assert launcher.placement_shortfall({"GPU": 0.5}, 2, "PACK", two) == (
        "the run asks for 2 workers x {GPU: 0.5} = {GPU: 1}; the cluster has {GPU: 0} on 2 node(s)")
    split = [{"Resources": {"CPU": 4.0}}, {"Resources": {"GPU": 1.0}}]
    assert launcher.placement_shortfall({"CPU": 1.0, "GPU": 1.0}, 1, "STRICT_PACK", split) == (
        "placement STRICT_PACK puts all 1 workers x {CPU: 1, GPU: 1} on one node; the largest node fits 0")
    # the totals add up over the nodes, and exactly enough is enough
    assert launcher.placement_shortfall({"CPU": 1.5}, 2, "PACK", two) is None
    assert launcher.placement_shortfall({"CPU": 0.1}, 30, "PACK", two) is None
    assert launcher.placement_shortfall({"CPU": 1.0, "GPU": 1.0}, 2, "PACK", two) == (
        "the run asks for 2 workers x {CPU: 1, GPU: 1} = {CPU: 2, GPU: 2}; the cluster has {CPU: 3, GPU: 0} "
        "on 2 node(s)")


def test_brief_names_a_dead_actor_and_unwraps_a_task_error():
    assert launcher.brief(_dead(55)) == "actor Worker (pid 55) died (Dead)"
    anon = type("Gone", (ray.exceptions.RayActorError,), {"__str__": lambda self: "gone"})()
    assert launcher.brief(anon) == "a Ray actor died (Gone)"
    try:
        raise ValueError("inner  cause\n on two lines")
    except ValueError as cause:
        wrapped = ray.exceptions.RayTaskError("step", "Traceback ...\n" * 50, cause)
    assert launcher.brief(wrapped) == "ValueError: inner cause on two lines"
    plain = ValueError("outer")
    plain.cause = KeyError("inner")  # only Ray's task errors are unwrapped
    assert launcher.brief(plain) == "ValueError: outer"
    assert launcher.brief(ValueError("x" * 588)) == "ValueError: " + "x" * 588  # 600 characters: whole
    long = launcher.brief(ValueError("a" * 300 + "b" * 700))
    assert long == "ValueError: " + "a" * 188 + " ... " + "b" * 400 and len(long) == 200 + 5 + 400


def test_with_vllm_the_workers_start_with_torchs_cpp_log_at_error(monkeypatch):
    monkeypatch.delenv("TORCH_CPP_LOG_LEVEL", raising=False)
    base = _plan()
    plan = dataclasses.replace(base, worker=dataclasses.replace(base.worker, rollout=RolloutSpec("vllm", "test")))
    group, fake = _group(monkeypatch, plan=plan)
    assert [o.get("runtime_env") for o in fake.options] == [{"env_vars": {"TORCH_CPP_LOG_LEVEL": "ERROR"}}] * 2
    assert launcher.worker_env(base) == {}  # transformers generate: the workers' log as it is
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "INFO")  # a level the driver's environment sets wins
    group, fake = _group(monkeypatch, plan=plan)
    assert all("runtime_env" not in o for o in fake.options)
