"""RayActorGroup: one Ray actor per rank in a placement group, driven together.

It only sends commands: a stage's rows come from the caller (the stage runner,
trainer/stage_runner.py, which owns the dock's dispatch and put)."""
import math
import os
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from mindspeed_rl.utils.error_cause import BRIEF_CHARS, brief  # noqa: F401  (the launcher's names too)
from mindspeed_rl.balance.rollout_queue import RolloutQueue
from mindspeed_rl.workers.base_worker import BaseWorker
from mindspeed_rl.workers.parallel_state import ParallelState
from mindspeed_rl.workers.upstream_io import UpstreamGroupIO



def _accelerator() -> Optional[str]:
    resources = ray.cluster_resources()
    for name in ("NPU", "GPU"):
        if resources.get(name, 0) >= 1:
            return name
    return None



def worker_env(run_plan) -> Dict[str, str]:
    """Variables the workers' processes start with: with vLLM, torch's C++ log below ERROR is off (vLLM's CPU
    build reports its NUMA binding through it on every engine start); a level the driver's environment sets wins."""
    if run_plan.worker.rollout.backend != "vllm" or "TORCH_CPP_LOG_LEVEL" in os.environ:
        return {}
    return {"TORCH_CPP_LOG_LEVEL": "ERROR"}

class PendingStage(NamedTuple):
    """A stage started on a group and not yet waited for (``RayActorGroup.finish_stage``)."""
    name: str
    refs: list
    queue: Any  # the RolloutQueue actor the round holds (None: a planned stage)


class StageTimeoutError(TimeoutError):
    """A command on the worker group passed its deadline (the silent ranks are named)."""


class PlacementError(RuntimeError):
    """The cluster cannot place the workers the run asks for."""


PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def choose_strategy(configured: str, num_nodes: int) -> str:
    """``rl_config.placement_strategy``: 'auto' spreads DP ranks over the nodes
    of a multi-node cluster and packs them on a single node."""
    if configured == "auto":
        return "SPREAD" if num_nodes > 1 else "PACK"
    if configured not in PLACEMENT_STRATEGIES:
        raise ValueError(f"rl_config.placement_strategy must be 'auto' or one of {PLACEMENT_STRATEGIES}, "
                         f"got {configured!r}")
    return configured


def _nodes() -> List[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _whereabouts(_actor=None) -> Tuple[int, str]:
    return os.getpid(), ray.get_runtime_context().get_node_id()


_STATES = {"T": "stopped", "t": "stopped", "Z": "zombie", "X": "dead", "D": "in uninterruptible I/O"}


def _process_state(pid: int) -> Optional[str]:
    """A local process's state when it is not running or sleeping normally (Linux /proc), else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return _STATES.get(f.read().rsplit(")", 1)[1].split()[0])
    except (OSError, IndexError):
        return None


def _fmt(resources: Dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"


def placement_shortfall(bundle: Dict[str, float], count: int, strategy: str, nodes: List[dict]) -> Optional[str]:
    """Why ``count`` bundles cannot be placed on ``nodes`` at all (None when they fit)."""
    totals: Dict[str, float] = {}
    for node in nodes:
        for key, value in node.get("Resources", {}).items():
            totals[key] = totals.get(key, 0.0) + value
    asked = {k: v * count for k, v in bundle.items()}
    short = [k for k, v in asked.items() if totals.get(k, 0.0) + 1e-9 < v]
    has = _fmt({k: totals.get(k, 0.0) for k in bundle})
    if short:
        return (f"the run asks for {count} workers x {_fmt(bundle)} = {_fmt(asked)}; the cluster has "
                f"{has} on {len(nodes)} node(s)")
    if strategy == "STRICT_SPREAD" and count > len(nodes):
        return f"placement STRICT_SPREAD puts each of {count} workers on its own node; the cluster has {len(nodes)}"
    if strategy == "STRICT_PACK":
        # a bundle that asks for nothing fits any node any number of times
        best = max((min((n.get("Resources", {}).get(k, 0.0) / v for k, v in bundle.items() if v), default=math.inf)
                    for n in nodes), default=0.0)
        if best + 1e-9 < count:
            return (f"placement STRICT_PACK puts all {count} workers x {_fmt(bundle)} on one node; the largest "
                    f"node fits {int(best)}")
    return None


def _place(bundle: Dict[str, float], count: int, strategy: str, timeout: float, custom: bool = False):
    """A ready placement group of ``count`` bundles, or one line saying what was asked and what the cluster has."""
    nodes = _nodes()
    hint = " (rl_config.actor_resource.num_npus sets the worker count" + (
        "; custom_resources under it, the Ray resources each worker asks for)" if custom else ")")
    problem = placement_shortfall(bundle, count, strategy, nodes)
    if problem:
        raise PlacementError(f"cannot place the workers: {problem}{hint}")
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    try:
        ray.get(group.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        free = _fmt({k: ray.available_resources().get(k, 0.0) for k in bundle})
        raise PlacementError(f"cannot place the workers within {timeout:g}s: the run asks for {count} workers x "
                             f"{_fmt(bundle)} ({strategy}); the cluster has {free} free now on {len(nodes)} "
                             f"node(s) (other jobs hold the rest?){hint}") from None
    return group


class RayActorGroup(UpstreamGroupIO):
    def __init__(self, worker: Type[BaseWorker], run_plan, num_cpus_per_worker: Optional[float] = None,
                 stage_timeout: Optional[float] = None, device_share: float = 1.0,
                 colocate_with: Optional["RayActorGroup"] = None, **kwargs):
        """One worker per device of ``run_plan.layout``; each rank gets the run
        plan only (its ``worker`` spec holds what a rank reads of the configs).
        Each rank's bundle asks for its CPU, its device and the layout's custom resources
        (rl_config.<group>_resource.custom_resources), so the group lands on the nodes that offer them.
        ``device_share``: the part of its device each rank takes (0.5 where an async mode puts a rollout engine
        beside it); ``colocate_with``: a group whose bundles this one shares, rank by rank (the engines of
        trainer_mode=colocate_async: same node, same device, no CPU of their own).
        ``stage_timeout`` bounds one command on the group (None: the run plan's
        stage deadline, ``rl_config.stage_timeout``); a rank that fails or dies
        ends the command at once, a rank that does not answer by the deadline is named."""
        self.worker = worker
        self.run_plan = run_plan
        self.world_size = run_plan.layout.world_size
        # (dp rank, tp rank) of each rank: which rows it gets, whether its outputs are kept
        self.states = [ParallelState.from_layout(rank, run_plan.layout) for rank in range(self.world_size)]
        self.stage_timeout = stage_timeout if stage_timeout is not None else run_plan.timeouts.stage_deadline
        self.actors, self.pids = [], []
        self.queue, self.rounds = None, 0  # the rollout queue's actor (trainer.stage_runner: queued stages)
        self._free_queues: List[Any] = []  # queue actors of rounds finished (rounds in flight hold their own)
        accel = _accelerator()
        cpus = num_cpus_per_worker if num_cpus_per_worker is not None else (1 if accel else 0.5)
        custom = dict(run_plan.layout.resources)
        bundle = {"CPU": cpus, **({accel: 1} if accel else {}), **custom}
        self.strategy = choose_strategy(run_plan.placement, len(_nodes()))
        self.owns_placement = colocate_with is None
        if colocate_with is not None:
            if colocate_with.world_size != self.world_size:
                raise PlacementError(f"a colocated group needs one rank per rank of the group it shares: "
                                     f"{self.world_size} vs {colocate_with.world_size}")
            self.placement_group, cpus = colocate_with.placement_group, 0
        else:
            self.placement_group = _place(bundle, self.world_size, self.strategy, run_plan.timeouts.placement,
                                          custom=bool(custom))
        remote_cls = ray.remote(worker)
        for rank in range(self.world_size):
            options = dict(num_cpus=cpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=rank))
            if accel == "GPU":
                options["num_gpus"] = device_share
            elif accel:
                options["resources"] = {accel: device_share}
            env = worker_env(run_plan)
            if env:
                options["runtime_env"] = {"env_vars": env}
            self.actors.append(remote_cls.options(**options).remote(
                rank=rank, world_size=self.world_size, run_plan=run_plan, **kwargs))
        # (pid, node id) per rank: named when a rank does not answer
        # starting the workers (imports, process group) is bounded by the placement timeout, not the stage deadline
        start = max(self.stage_timeout or 0.0, run_plan.timeouts.placement)
        self.pids = self._wait([a.__ray_call__.remote(_whereabouts) for a in self.actors], "start", start)
        addr, port = self._wait([self.actors[0].get_master_addr_port.remote()], "get_master_addr_port", start)[0]
        self._wait([a.init_distributed.remote(addr, port) for a in self.actors], "init_distributed", start)

    # ------------------------------------------------------------ running commands

    def _wait(self, refs: List[ray.ObjectRef], name: str, timeout: Optional[float] = None) -> List[Any]:
        """Results in rank order; the first failing rank ends the group with a
        clear error instead of leaving the others blocked in a collective, and
        ranks that do not answer within ``timeout`` (default ``stage_timeout``) are named."""
        timeout = self.stage_timeout if timeout is None else timeout
        index = {ref: i for i, ref in enumerate(refs)}
        results: Dict[int, Any] = {}
        pending = list(refs)
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not ready:
                silent = sorted(index[r] for r in pending)
                key = "rl_config.stage_timeout" if timeout == self.stage_timeout else "worker start"
                who = self._ranks(silent)  # read the ranks' states before the kill changes them
                self.kill()
                raise StageTimeoutError(
                    f"'{name}' did not finish within {timeout:g}s ({key}): "
                    f"{who} did not answer"
                    + (f", rank(s) {sorted(results)} finished" if results else "") + "; the run stops")
            try:
                results[index[ready[0]]] = ray.get(ready[0])
            except Exception:  # a rank died or raised
                rank, err, silent = self._root_cause(ready[0], pending, index)
                also = f" ({self._ranks(silent)} did not answer either)" if silent else ""
                self.kill()
                raise RuntimeError(f"worker rank {rank} failed in '{name}': {brief(err)}{also}") from err
        return [results[i] for i in range(len(refs))]

    def _ranks(self, ranks: List[int]) -> str:
        """'rank 1 (pid 123, stopped)' / 'ranks 0, 1 (pid 122; pid 123, stopped)': the state of a
        worker on the driver's node is read from /proc (stopped, zombie, ...)."""
        label = "rank" if len(ranks) == 1 else "ranks"
        if len(self.pids) < len(self.actors) or not ranks or max(ranks) >= len(self.pids):
            return f"{label} {', '.join(map(str, ranks))}"
        here = ray.get_runtime_context().get_node_id()
        notes = []
        for r in ranks:
            pid, node = self.pids[r]
            state = _process_state(pid) if node == here else None
            notes.append(f"pid {pid}" + (f", {state}" if state else ""))
        return f"{label} {', '.join(map(str, ranks))} ({'; '.join(notes)})"

    @staticmethod
    def _root_cause(first, pending, index, grace: float = 3.0):
        """The failure to report, and the ranks still silent after ``grace``: a
        dead rank or a rank's own error beats the collective errors its peers
        see as a consequence (closed connections, collective timeouts)."""
        done, silent = ray.wait(pending, num_returns=len(pending), timeout=grace) if pending else ([], [])
        failures = []
        for ref in [first, *done]:
            try:
                ray.get(ref)
            except Exception as err:
                failures.append((index[ref], err))

        def secondary(err) -> bool:
            text = str(err).lower()
            return not isinstance(err, ray.exceptions.RayActorError) and any(
                word in text for word in ("gloo", "connection", "nccl", "hccl", "timed out"))
        failures.sort(key=lambda item: (not isinstance(item[1], ray.exceptions.RayActorError),
                                        secondary(item[1]), item[0]))
        rank, err = failures[0]
        return rank, err, sorted(index[r] for r in silent)

    def execute_sync_command(self, method_name: str, *args, **kwargs) -> List[Any]:
        return self._wait([getattr(a, method_name).remote(*args, **kwargs) for a in self.actors], method_name)

    # ------------------------------------------------------------ stages

    def run_stage(self, group, plan: List[List[List[int]]], batches: list,
                  **context) -> Tuple[List[Dict[str, float]], list]:
        """Send every rank its command for ``group`` (trainer.stage_runner.StageGroup):
        the round's ``plan``, its DP rank's rows ``batches[dp_rank]`` (TP peers
        share one object) and ``context`` (iteration, kl_coef). Returns every
        rank's metrics and, in DP order, the TP sources' output columns."""
        if self.run_plan.layout.tp > 1:  # one object per DP rank, shared by its TP peers
            batches = [ray.put(b) for b in batches]
        replies = self._wait([actor.run_stage.remote(group, plan, batches[state.dp_rank], **context)
                              for actor, state in zip(self.actors, self.states)], group.name)
        return [m for m, _ in replies], [out for (_, out), state in zip(replies, self.states) if state.tp_rank == 0]

    def _rollout_queue(self):
        """A free RolloutQueue actor of this group (made when none is free, ended with the group), on the driver's
        node: on a cluster, a worker node that dies takes its ranks, not the queue of the others. A round holds its
        queue until it is finished (the async modes keep several rounds in flight)."""
        if self._free_queues:
            return self._free_queues.pop()
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        queue = ray.remote(RolloutQueue).options(num_cpus=0, scheduling_strategy=here).remote()
        self.queue = self.queue or queue
        self._made_queues = getattr(self, "_made_queues", []) + [queue]
        return queue

    def start_queued_stage(self, group, queued, **context) -> "PendingStage":
        """Start serving the queued stage of ``group`` (trainer.stage_runner.StageGroup, one stage) on the round
        ``queued`` (data.driver_dock.QueueRound): its rows go into a queue of this group, their inputs into Ray's
        object store once, and every rank takes rows until the queue is drained. Returns at once;
        ``finish_stage`` waits for the ranks. A rank's calls run in the order they were sent, so a later round
        (or a weight load) sent to the group starts on each rank when that rank is done with this one."""
        stage = self.run_plan.stages[group.names[0]]
        chunk, cap = self.run_plan.rollout_takes(stage)
        queue = self._rollout_queue()
        self.rounds += 1
        key = self.rounds
        # every engine's first take is answered with the load (an engine starts with max_num_seqs free slots)
        firsts = ray.get(queue.load.remote(key, len(queued.order), self.run_plan.rollout_consumers, chunk, cap,
                                           queued.groups, queued.prior, self.run_plan.worker.rollout.max_num_seqs,
                                           stop=queued.stop, handoff=self.run_plan.rollout_handoff),
                         timeout=self.stage_timeout)
        shared = ray.put(queued.batch)
        refs = [actor.run_queued_stage.remote(group, queued.order, shared, queue, key, firsts=firsts, **context)
                for actor in self.actors]
        return PendingStage(group.name, refs, queue)

    def start_stage(self, group, plan: List[List[List[int]]], batches: list, **context) -> "PendingStage":
        """``run_stage`` without waiting (``finish_stage`` waits)."""
        if self.run_plan.layout.tp > 1:
            batches = [ray.put(b) for b in batches]
        refs = [actor.run_stage.remote(group, plan, batches[state.dp_rank], **context)
                for actor, state in zip(self.actors, self.states)]
        return PendingStage(group.name, refs, None)

    def finish_stage(self, pending: "PendingStage") -> Tuple[List[Dict[str, float]], list]:
        """Wait for a started stage: every rank's metrics and, per rank that returns rows, its outputs (a queued
        stage: (output columns, trace) per consumer; a planned one: the TP sources' columns in DP order)."""
        replies = self._wait(pending.refs, pending.name)
        if pending.queue is None:
            return [m for m, _ in replies], [out for (_, out), state in zip(replies, self.states)
                                             if state.tp_rank == 0]
        self._free_queues.append(pending.queue)
        return [m for m, _, _ in replies], [(out, trace) for _, out, trace in replies if out is not None]

    def stage_done(self, pending: "PendingStage") -> bool:
        """Every rank has answered a started stage (it may have failed: ``finish_stage`` says)."""
        return len(ray.wait(list(pending.refs), num_returns=len(pending.refs), timeout=0)[0]) == len(pending.refs)

    def wait(self, refs: List[ray.ObjectRef], name: str) -> List[Any]:
        """Results of calls made on the ranks (in rank order), as a command's: a failure or silence is named."""
        return self._wait(refs, name)

    def policy_state_ref(self) -> ray.ObjectRef:
        """The actor's full weights (every rank gathers, rank 0 returns them) as an object reference: the
        engines read them from the object store, not through the driver."""
        refs = [actor.policy_state.remote() for actor in self.actors]
        self._wait(refs[1:], "policy_state")
        self._wait_ready(refs[0], "policy_state")
        return refs[0]

    def _wait_ready(self, ref, name: str) -> None:
        ready, _ = ray.wait([ref], timeout=self.stage_timeout)
        if not ready:
            self.kill()
            raise StageTimeoutError(f"'{name}' did not finish within {self.stage_timeout:g}s "
                                    f"(rl_config.stage_timeout): rank 0 did not answer; the run stops")

    def load_weights(self, state_ref, version: int) -> List[ray.ObjectRef]:
        """Send weight version ``version`` to every engine; each loads it after the calls sent before (wait on
        the returned references)."""
        return [actor.load_weights.remote(state_ref, version) for actor in self.actors]

    def run_queued_stage(self, group, queued, **context) -> Tuple[List[Dict[str, float]], list]:
        """``start_queued_stage`` and ``finish_stage``: every rank's metrics and, per consumer that returns rows,
        (output columns, trace)."""
        return self.finish_stage(self.start_queued_stage(group, queued, **context))

    def initialize(self, *args):
        return self.execute_sync_command("initialize", *args)

    def save_checkpoint(self, folder: str, with_optimizer: bool = True, with_rng: bool = True):
        return self.execute_sync_command("save_checkpoint", folder, with_optimizer, with_rng)[0]

    def load_checkpoint(self, folder: str, iteration: int, with_optimizer: bool = True, with_rng: bool = True):
        return self.execute_sync_command("load_checkpoint", folder, iteration, with_optimizer, with_rng)[0]

    def export_hf(self, path: str):
        return self.execute_sync_command("export_hf", path)[0]

    def kill(self):
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        self.actors = []
        for queue in getattr(self, "_made_queues", []):
            try:
                ray.kill(queue, no_restart=True)
            except Exception:  # already gone
                pass
        self.queue, self._made_queues, self._free_queues = None, [], []
        if self.placement_group is not None and getattr(self, "owns_placement", True):
            remove_placement_group(self.placement_group)
        self.placement_group = None

    def shutdown(self):
        if self.actors:
            try:
                self.execute_sync_command("shutdown")
            finally:
                self.kill()
