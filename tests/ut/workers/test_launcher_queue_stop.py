"""The launcher loads a stoppable round (partial rollout's async_engine) into its queue with the round's stop
rule; a plain round's queue has none."""
import dataclasses

from mindspeed_rl.plan.run_plan import StagePlan
from mindspeed_rl.plan.stages import TRAIN
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.data.driver_dock import QueueRound
from mindspeed_rl.balance.rollout_queue import StopRule
from mindspeed_rl.workers.scheduler import launcher
from ut.workers.test_launcher_group import FakeRay, Worker, _plan


class Queued(Worker):
    def run_queued_stage(self, group, order, batch, queue, key, **context):
        return {"rank": self.rank}, None, None


def test_the_rounds_stop_rule_goes_into_the_queue(monkeypatch):
    FakeRay().install(monkeypatch)
    rollout = StagePlan("stage_q", 2, 1, False, stage=TRAIN, queued=True)
    plan = dataclasses.replace(_plan(world=2, tp=1), stages={"stage_q": rollout})
    group = launcher.RayActorGroup(Queued, plan)
    rule = StopRule(1, [False, True, False, False], [False, False, True, False])
    queued = QueueRound([0, 1, 2, 3], "inputs", [0, 0, 1, 1], [0.0] * 4, rule)
    group.run_queued_stage(StageGroup.of(rollout), queued)
    stop = group.queue.obj._stop
    assert stop.need == 1 and stop.sure.tolist() == rule.sure and stop.must.tolist() == rule.must
    group.run_queued_stage(StageGroup.of(rollout), queued._replace(stop=None))
    assert group.queue.obj._stop is None
