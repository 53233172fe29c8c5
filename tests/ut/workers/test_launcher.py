"""RayActorGroup: ranks wired into one process group; a failing rank ends the run with a clear error.

Deadlines here are generous (START_S): a loaded machine may take minutes to start
the workers; the tests check what happens, not how fast."""
import pytest
import torch.distributed as dist

from mindspeed_rl.plan.run_plan import Layout, RunPlan, StagePlan, Timeouts
from mindspeed_rl.plan.stages import TRAIN
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.utils.dist_sync import all_reduce_scalar
from mindspeed_rl.workers.base_worker import BaseWorker
from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

START_S = 600.0  # worker start (placement, imports, process group) and each command


def _plan(world=2, tp=1, timeout=START_S):
    return RunPlan(Layout(world, world // tp, tp), prompts_per_round=1, n_samples=1, mini_batch_rows=1,
                   epochs=1, train_iters=1, timeouts=Timeouts(timeout, timeout + 60, timeout))


def test_group_ranks_and_layout(local_ray):
    class Probe(BaseWorker):
        def layout(self):
            ps = self.parallel_state
            total = all_reduce_scalar(float(self.rank), "sum", None)
            return ps.tp_rank, ps.dp_rank, ps.tp_src, total

    plan = _plan(world=4, tp=2)
    group = RayActorGroup(Probe, plan, num_cpus_per_worker=0.25)
    try:
        rows = group.execute_sync_command("layout")
    finally:
        group.shutdown()
    assert rows == [(0, 0, 0, 6.0), (1, 0, 0, 6.0), (0, 1, 2, 6.0), (1, 1, 2, 6.0)]


def test_failing_rank_ends_group_instead_of_hanging(local_ray):
    class Flaky(BaseWorker):
        def step(self):
            if self.rank == 1:
                raise ValueError("boom on purpose")
            dist.barrier()  # rank 0 would wait for rank 1 forever
            return self.rank

    plan = _plan(world=2)
    group = RayActorGroup(Flaky, plan, num_cpus_per_worker=0.25)
    # rank 0 is blocked in the barrier: the group ends on rank 1's error, not on the stage deadline
    with pytest.raises(RuntimeError, match=r"(?s)worker rank 1 failed in 'step'.*boom on purpose"):
        group.execute_sync_command("step")
    assert group.actors == []  # the group was torn down


def test_dead_worker_is_reported(local_ray):
    class Crasher(BaseWorker):
        def step(self):
            if self.rank == 0:
                import os
                os._exit(1)
            dist.barrier()

    plan = _plan(world=2)
    group = RayActorGroup(Crasher, plan, num_cpus_per_worker=0.25)
    with pytest.raises(RuntimeError, match="worker rank 0 failed in 'step'"):
        group.execute_sync_command("step")


def test_run_stage_sends_each_dp_rank_its_rows_and_returns_the_tp_sources_outputs(local_ray):
    class Probe(BaseWorker):
        def run_stage(self, group, plan, batch, **context):
            return ({"rank": self.rank, "rows": batch["rows"], "plan": plan, "names": group.names, **context},
                    f"out of rank {self.rank}")

    class Dock:  # a driver's dock: it stays in the driver
        pass

    stage = StagePlan("stage_x", 2, 1, False, stage=TRAIN)
    plan = _plan(world=4, tp=2)
    group = RayActorGroup(Probe, plan, num_cpus_per_worker=0.25)
    try:
        metrics, outputs = group.run_stage(StageGroup.of(stage), [[[0, 1]], [[2, 3]]],
                                           [{"rows": [0, 1]}, {"rows": [2, 3]}], iteration=7)
        with pytest.raises(TypeError, match="ranks take a GRPOTransferDock actor handle, got Dock"):
            group.sync_init_transfer_dock(Dock())  # never pickled to the ranks
    finally:
        group.shutdown()
    # ranks 0, 1 are DP rank 0 (TP peers), ranks 2, 3 DP rank 1
    assert [m["rows"] for m in metrics] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert all(m["iteration"] == 7 and m["plan"] == [[[0, 1]], [[2, 3]]] and m["names"] == ("stage_x",)
               for m in metrics)
    assert outputs == ["out of rank 0", "out of rank 2"]
