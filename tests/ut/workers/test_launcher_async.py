"""What the launcher gives the async trainer modes (a fake Ray of test_launcher_group.py): rounds started and
finished apart, each holding its own queue while in flight; a started stage's state; the actor's weights as one
object reference; weight loads sent to every engine; a colocated group on the bundles of another."""
import dataclasses

import pytest

from mindspeed_rl.plan.run_plan import StagePlan
from mindspeed_rl.plan.stages import TRAIN
from mindspeed_rl.data.driver_dock import QueueRound
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.workers.scheduler import launcher
from ut.workers.test_launcher_group import NEVER, FakeRay, Worker, _plan


class Engine(Worker):
    version = 0

    def run_queued_stage(self, group, order, batch, queue, key, **context):
        rows = queue.obj.take(key, self.rank, 0, 8)
        if context.get("iteration") == -1 and self.rank == 1:
            raise RuntimeError("engine died")
        return {"rank": self.rank, "key": key, "queue": id(queue.obj)}, f"out {self.rank}", {"rows": rows}

    def policy_state(self):
        if self.extra.get("silent_state") and self.rank == 0:
            return NEVER
        return {"w": self.rank} if self.rank == 0 else None

    def load_weights(self, state, version):
        if state == "bad":
            raise ValueError("weights do not fit")
        self.version = version
        return version


def _queued_group(monkeypatch, **kwargs):
    fake = FakeRay().install(monkeypatch)
    rollout = StagePlan("stage_q", 2, 1, False, stage=TRAIN, queued=True)
    plan = dataclasses.replace(_plan(world=2), stages={"stage_q": rollout})
    return launcher.RayActorGroup(Engine, plan, **kwargs), StageGroup.of(rollout), fake


def _round(tag):
    return QueueRound([0, 1, 2, 3], tag, [0, 0, 1, 1], [float("nan")] * 4)


def test_rounds_in_flight_hold_queues_of_their_own_and_give_them_back(monkeypatch):
    group, stage, _ = _queued_group(monkeypatch)
    first = group.start_queued_stage(stage, _round("a"), iteration=1)
    second = group.start_queued_stage(stage, _round("b"), iteration=2)
    assert first.queue is not second.queue and first.queue is group.queue  # the first queue made stays named
    assert group.stage_done(first) and group.stage_done(second)
    metrics, made = group.finish_stage(second)
    assert [m["key"] for m in metrics] == [2, 2] and {m["queue"] for m in metrics} == {id(second.queue.obj)}
    assert made == [("out 0", {"rows": [0, 1]}), ("out 1", {"rows": [2, 3]})]
    third = group.start_queued_stage(stage, _round("c"), iteration=3)
    assert third.queue is second.queue  # a finished round's queue serves the next one
    group.finish_stage(first)
    group.finish_stage(third)
    assert len(group._made_queues) == 2 and len(group._free_queues) == 2


def test_a_round_that_is_not_done_and_an_engine_that_dies_in_one(monkeypatch):
    group, stage, fake = _queued_group(monkeypatch)
    pending = group.start_queued_stage(stage, _round("a"), iteration=1)
    pending.refs[1].value = NEVER
    assert not group.stage_done(pending)
    died = group.start_queued_stage(stage, _round("b"), iteration=-1)
    fake.killed.clear()
    with pytest.raises(RuntimeError, match=r"^worker rank 1 failed in 'stage_q': RuntimeError: engine died$"):
        group.finish_stage(died)
    assert fake.killed[:2] == [0, 1]  # the group ends, its queues with it


def test_the_weights_travel_as_one_reference_and_every_engine_loads_them(monkeypatch):
    group, _, _ = _queued_group(monkeypatch)
    ref = group.policy_state_ref()
    assert ref.value == {"w": 0}  # rank 0's full state; the others gathered with it and returned nothing
    loads = group.load_weights(ref, 4)
    assert group.wait(loads, "load_weights") == [4, 4]
    assert [a.obj.version for a in group.actors] == [4, 4]
    with pytest.raises(RuntimeError, match=r"^worker rank 0 failed in 'load_weights': ValueError: weights do not fit"):
        group.wait(group.load_weights("bad", 5), "load_weights")


def test_a_rank_that_never_gives_its_weights_is_named(monkeypatch):
    group, _, fake = _queued_group(monkeypatch, silent_state=True)
    with pytest.raises(launcher.StageTimeoutError, match=r"^'policy_state' did not finish within 20s "
                                                         r"\(rl_config.stage_timeout\): rank 0 did not answer"):
        group.policy_state_ref()


def test_a_colocated_group_shares_the_bundles_of_another(monkeypatch):
    fake = FakeRay().install(monkeypatch)
    plan = _plan(world=2)
    trainer = launcher.RayActorGroup(Worker, plan, device_share=0.5)
    engines = launcher.RayActorGroup(Worker, plan, colocate_with=trainer, device_share=0.5)
    assert len(fake.groups) == 1 and engines.placement_group is trainer.placement_group
    # no CPU of their own, rank r on the trainer's bundle r
    engine_options = fake.options[-2:]
    assert [o["num_cpus"] for o in engine_options] == [0, 0]
    assert [o["scheduling_strategy"][2] for o in engine_options] == [0, 1]
    engines.kill()
    assert fake.removed == []  # the bundles are the trainer's: they stay
    trainer.kill()
    assert fake.removed == [fake.groups[0]]
    with pytest.raises(launcher.PlacementError, match="a colocated group needs one rank per rank of the group it "
                                                      "shares: 4 vs 2"):
        launcher.RayActorGroup(Worker, _plan(world=4), colocate_with=launcher.RayActorGroup(Worker, plan))
