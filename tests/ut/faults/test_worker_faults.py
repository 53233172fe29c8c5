"""Worker-side faults on a real local Ray: a stopped worker (SIGSTOP of its pid) during a stage ends
in one error naming the stage and the silent rank; too many ranks for the cluster is one line."""
import os
import signal

import pytest
import torch.distributed as dist

from mindspeed_rl.workers.base_worker import BaseWorker
from mindspeed_rl.workers.scheduler import launcher
from mindspeed_rl.plan.run_plan import Layout, RunPlan, Timeouts


def _plan(world=2, timeout=600.0, stage=None):
    # generous: starting the workers on a loaded machine may take minutes (the stage deadline is the test's own)
    return RunPlan(Layout(world, world, 1), prompts_per_round=1, n_samples=1, mini_batch_rows=1,
                   epochs=1, train_iters=1, timeouts=Timeouts(timeout, timeout + 60, timeout, stage=stage))


def test_stopped_worker_is_named_after_the_stage_deadline(local_ray):
    class Stage(BaseWorker):
        def step(self):
            dist.barrier()  # rank 0 waits here for the stopped rank 1
            return self.rank

    plan = _plan(world=2, stage=4.0)  # rl_config.stage_timeout, as build_run_plan writes it
    group = launcher.RayActorGroup(Stage, plan, num_cpus_per_worker=0.25)
    assert group.stage_timeout == 4.0
    group_pids = [p for p, _ in group.pids]
    pid = group_pids[1]
    assert pid != os.getpid() and pid != group.pids[0][0]
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(launcher.StageTimeoutError) as info:
            group.execute_sync_command("step")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    # rank 0 waits in the barrier for rank 1: both are silent, the stopped one is marked
    assert str(info.value) == (f"'step' did not finish within 4s (rl_config.stage_timeout): ranks 0, 1 "
                               f"(pid {group_pids[0]}; pid {pid}, stopped) did not answer; the run stops")
    assert group.actors == [] and group.placement_group is None  # the group was torn down


def test_more_ranks_than_the_cluster_has_is_one_line(local_ray):
    plan = _plan(world=8)
    with pytest.raises(launcher.PlacementError) as info:
        launcher.RayActorGroup(BaseWorker, plan)
    assert str(info.value) == ("cannot place the workers: the run asks for 8 workers x {CPU: 0.5} = {CPU: 4}; the "
                               "cluster has {CPU: 2} on 1 node(s) (rl_config.actor_resource.num_npus sets the "
                               "worker count)")


def test_an_engine_that_dies_mid_stream_is_named_and_ends_the_group(local_ray):
    """separate_async's engines: a batch in flight when an engine's process is killed ends in one line naming
    the rank and the stage when the trainer collects the batch; the group is torn down."""
    import time

    from mindspeed_rl.plan.run_plan import StagePlan
    from mindspeed_rl.plan.stages import TRAIN
    from mindspeed_rl.data.driver_dock import QueueRound
    from mindspeed_rl.trainer.stage_runner import StageGroup

    class Engine(BaseWorker):
        def run_queued_stage(self, group, order, batch, queue, key, **context):
            time.sleep(60 if self.rank == 1 else 0)  # rank 1 is mid-generation when it is killed
            return {"rank": self.rank}, None, None

    rollout = StagePlan("actor_rollout", 4, 2, False, stage=TRAIN, queued=True)
    plan = _plan(world=2)
    plan = RunPlan(plan.layout, prompts_per_round=1, n_samples=1, mini_batch_rows=1, epochs=1, train_iters=1,
                   timeouts=plan.timeouts, stages={"actor_rollout": rollout})
    group = launcher.RayActorGroup(Engine, plan, num_cpus_per_worker=0.25)
    pid = group.pids[1][0]
    pending = group.start_queued_stage(StageGroup.of(rollout), QueueRound([0, 1, 2, 3], {}, [0, 0, 1, 1],
                                                                          [float("nan")] * 4), iteration=1)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(RuntimeError) as info:
        group.finish_stage(pending)
    assert str(info.value).startswith("worker rank 1 failed in 'actor_rollout': ")
    assert "\n" not in str(info.value)
    assert group.actors == [] and group.placement_group is None


def test_a_trainer_rank_that_dies_between_syncs_is_named_and_the_engines_batch_survives(local_ray):
    """separate_async: a trainer rank killed during its update while the engines sample the next batch ends the
    update in one line naming the rank and the stage; the engines' group is untouched and its batch is collected
    (a checkpoint taken then keeps it: trainer/modes/pipeline.py)."""
    import time

    from mindspeed_rl.plan.run_plan import StagePlan
    from mindspeed_rl.plan.stages import TRAIN
    from mindspeed_rl.data.driver_dock import QueueRound
    from mindspeed_rl.trainer.stage_runner import StageGroup

    class Trainer(BaseWorker):
        def run_stage(self, group, plan, batch, **context):
            time.sleep(60 if self.rank == 1 else 0)  # rank 1 is mid-update when it is killed
            return {"rank": self.rank}, None

    class Engine(BaseWorker):
        def run_queued_stage(self, group, order, batch, queue, key, **context):
            time.sleep(2.0)
            return {"rank": self.rank, "engine": 1.0}, None, None

    rollout = StagePlan("actor_rollout", 4, 2, False, stage=TRAIN, queued=True)
    update = StagePlan("actor_train", 4, 2, False, stage=TRAIN)
    base = _plan(world=2)
    plan = RunPlan(base.layout, prompts_per_round=1, n_samples=1, mini_batch_rows=1, epochs=1, train_iters=1,
                   timeouts=base.timeouts, stages={"actor_rollout": rollout, "actor_train": update})
    trainer = launcher.RayActorGroup(Trainer, plan, num_cpus_per_worker=0.25)
    engines = launcher.RayActorGroup(Engine, plan, num_cpus_per_worker=0.25)
    try:
        pending = engines.start_queued_stage(StageGroup.of(rollout), QueueRound([0, 1, 2, 3], {}, [0, 0, 1, 1],
                                                                                [float("nan")] * 4), iteration=2)
        started = trainer.start_stage(StageGroup.of(update), [[[0]], [[1]]], [{}, {}], iteration=1)
        time.sleep(1.0)
        os.kill(trainer.pids[1][0], signal.SIGKILL)
        with pytest.raises(RuntimeError) as info:
            trainer.finish_stage(started)
        assert str(info.value).startswith("worker rank 1 failed in 'actor_train': ")
        assert "\n" not in str(info.value)
        assert trainer.actors == []
        metrics, _ = engines.finish_stage(pending)  # the engines' batch in flight is whole
        assert sorted(m["rank"] for m in metrics) == [0, 1] and all(m["engine"] == 1.0 for m in metrics)
    finally:
        engines.shutdown()
