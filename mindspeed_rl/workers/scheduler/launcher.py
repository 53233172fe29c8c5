"""RayActorGroup: one Ray actor per rank in a placement group, driven together."""
from typing import Any, Dict, List, Optional, Tuple, Type

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from mindspeed_rl.workers.base_worker import BaseWorker
from mindspeed_rl.workers.parallel_state import ParallelState


def _accelerator() -> Optional[str]:
    resources = ray.cluster_resources()
    for name in ("NPU", "GPU"):
        if resources.get(name, 0) >= 1:
            return name
    return None


class RayActorGroup:
    def __init__(self, worker: Type[BaseWorker], megatron_config, rl_config, generate_config, run_plan,
                 num_cpus_per_worker: Optional[float] = None, stage_timeout: Optional[float] = None, **kwargs):
        """One worker per device of ``run_plan.layout``. ``stage_timeout``
        bounds one command on the group (None: no bound; a rank that fails or
        dies still ends the command at once)."""
        self.worker = worker
        self.megatron_config, self.rl_config, self.generate_config = megatron_config, rl_config, generate_config
        self.run_plan = run_plan
        self.world_size = run_plan.layout.world_size
        self.stage_timeout = stage_timeout
        accel = _accelerator()
        cpus = num_cpus_per_worker if num_cpus_per_worker is not None else (1 if accel else 0.5)
        bundle = {"CPU": cpus, **({accel: 1} if accel else {})}
        self.placement_group = placement_group([dict(bundle) for _ in range(self.world_size)], strategy="PACK")
        ray.get(self.placement_group.ready(), timeout=run_plan.timeouts.placement)
        remote_cls = ray.remote(worker)
        self.actors = []
        for rank in range(self.world_size):
            options = dict(num_cpus=cpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=rank))
            if accel == "GPU":
                options["num_gpus"] = 1
            elif accel:
                options["resources"] = {accel: 1}
            self.actors.append(remote_cls.options(**options).remote(
                megatron_config, rl_config, generate_config, rank=rank, world_size=self.world_size,
                run_plan=run_plan, **kwargs))
        addr, port = self._wait([self.actors[0].get_master_addr_port.remote()], "get_master_addr_port")[0]
        self.execute_sync_command("init_distributed", addr, port)

    # ------------------------------------------------------------ running commands

    def _wait(self, refs: List[ray.ObjectRef], name: str) -> List[Any]:
        """Results in rank order; the first failing rank ends the group with a
        clear error instead of leaving the others blocked in a collective."""
        index = {ref: i for i, ref in enumerate(refs)}
        results: Dict[int, Any] = {}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=self.stage_timeout)
            if not ready:
                self.kill()
                raise TimeoutError(f"worker group: '{name}' did not finish within {self.stage_timeout:g}s")
            try:
                results[index[ready[0]]] = ray.get(ready[0])
            except Exception:  # a rank died or raised
                rank, err = self._root_cause(ready[0], pending, index)
                self.kill()
                raise RuntimeError(f"worker rank {rank} failed in '{name}': {err}") from err
        return [results[i] for i in range(len(refs))]

    @staticmethod
    def _root_cause(first, pending, index, grace: float = 3.0):
        """The failure to report: a dead rank or a rank's own error beats the
        collective errors its peers see as a consequence (closed connections)."""
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=grace) if pending else ([], [])
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
        return failures[0]

    def execute_sync_command(self, method_name: str, *args, **kwargs) -> List[Any]:
        return self._wait([getattr(a, method_name).remote(*args, **kwargs) for a in self.actors], method_name)

    def execute_per_rank(self, method_name: str, args_per_rank: List[tuple], **kwargs) -> List[Any]:
        """``method_name`` on every rank, rank k with ``args_per_rank[k]``."""
        if len(args_per_rank) != len(self.actors):
            raise ValueError(f"'{method_name}': {len(args_per_rank)} argument sets for {len(self.actors)} ranks")
        return self._wait([getattr(a, method_name).remote(*args, **kwargs)
                           for a, args in zip(self.actors, args_per_rank)], method_name)

    # ------------------------------------------------------------ stages

    def run_stage(self, name: str, td, **context) -> Tuple[List[Dict[str, float]], List[ray.ObjectRef]]:
        """DP stage ``name`` of the run plan: one dock call plans the round and
        cuts each DP rank's rows; every rank gets its DP rank's row ids and rows
        (TP peers the same ones) and ``context`` (iteration, kl_coef). Returns the ranks' metrics and, in DP order,
        the TP sources' output refs (for the dock's ``put_stage``)."""
        layout = self.run_plan.layout
        refs = td.dispatch.options(num_returns=layout.dp + 1).remote(name)
        plan = ray.get(refs[0])
        outputs, metrics = [], []
        for rank, actor in enumerate(self.actors):
            dp_rank = ParallelState.from_layout(rank, layout).dp_rank
            m, out = actor.run_stage.options(num_returns=2).remote(name, plan[dp_rank], refs[1 + dp_rank],
                                                                   **context)
            metrics.append(m)
            if ParallelState.from_layout(rank, layout).tp_rank == 0:
                outputs.append(out)
        return self._wait(metrics, name), outputs

    def sync_init_transfer_dock(self, transfer_dock, mm_transfer_dock=None):
        self.execute_sync_command("init_transfer_dock", transfer_dock)

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
            ray.kill(actor, no_restart=True)
        self.actors = []
        remove_placement_group(self.placement_group)

    def shutdown(self):
        if self.actors:
            try:
                self.execute_sync_command("shutdown")
            finally:
                self.kill()
