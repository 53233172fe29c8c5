"""StageRunner over a recording dock and worker groups: which DP stages run together (same worker group,
same plan, no stage reading another's output, never a queued one), the driver, queued and DP stages in
order, the call context passed to every worker call, and the errors' messages."""
from types import SimpleNamespace

import pytest

import mindspeed_rl.trainer.stage_runner as sr
from mindspeed_rl.algorithms import DRIVER_STAGES
from mindspeed_rl.trainer.stage_runner import StageGroup, StageRunner


def dp(name, role="actor", inputs=(), outputs=(), **kw):
    """A DP stage as the runner reads it; ``queued`` only when given (a stage may not have the attribute)."""
    return SimpleNamespace(name=name, role=role, is_dp=True, inputs=tuple(inputs), outputs=tuple(outputs), **kw)


def driver_stage(name):
    return SimpleNamespace(name=name, role="driver", is_dp=False, method=name, inputs=(), outputs=(name,))


class Dock:
    """Records dispatches, puts and queued rounds; ``plans``: stage name -> its plan (default: one plan)."""

    def __init__(self, plans=None):
        self.plans, self.log = plans or {}, []

    def plan_stage(self, name):
        return self.plans.get(name, "plan")

    def dispatch(self, group):
        self.log.append(("dispatch", group.names))
        return "round-plan", "batch0", "batch1"

    def put_stage(self, group, *outputs):
        self.log.append(("put", group.names, outputs))

    def queue_round(self, group):
        assert ("queue", group.names) not in self.log, "a round is queued once"
        self.log.append(("queue", group.names))
        return SimpleNamespace(order=[1, 0])

    def put_queued(self, group, order, made):
        self.log.append(("put_queued", group.names, order, made))

    def record_plan(self, plan):
        self.log.append(("record", plan))


class Workers:
    """A worker group: records each call's stage names and context; one metrics dict per rank."""

    def __init__(self, tag):
        self.tag, self.calls = tag, []

    def run_stage(self, group, plan, batches, **context):
        self.calls.append((group.names, plan, tuple(batches), context))
        return [{"rank": self.tag + "0"}, {"rank": self.tag + "1"}], ("out0", "out1")

    def run_queued_stage(self, group, queued, **context):
        self.calls.append((group.names, context))
        return [{"rank": self.tag + "q"}], [("made0", {"rows": [0]}), ("made1", {"rows": [1]})]


class Driver:
    def __init__(self):
        self.ran = []

    def __getattr__(self, name):
        return lambda stage: self.ran.append(stage.name) or {f"driver/{stage.name}": 1.0}


@pytest.fixture
def figures(monkeypatch):
    seen = []

    def fake(dock, stage, queued, traces):
        seen.append((stage.name, queued.order, traces))
        return {"rollout/figure": 2.0}, "queue-plan"
    monkeypatch.setattr(sr, "rollout_figures", fake)
    return seen


def _names(runner, stages):
    out, i = [], 0
    while i < len(stages):
        group = runner.take_group(stages, i)
        out.append(group.names)
        i += len(group.stages)
    return out


def test_stages_without_a_queued_attribute_join_when_group_and_plan_agree():
    runner = StageRunner(Dock(), {"actor": Workers("a")})
    assert _names(runner, [dp("ref", outputs=["r"]), dp("old", outputs=["o"])]) == [("ref", "old")]


def test_a_queued_stage_never_joins_a_group():
    runner = StageRunner(Dock(), {"actor": Workers("a")})
    stages = [dp("ref", outputs=["r"], queued=False), dp("rollout", outputs=["x"], queued=True)]
    assert runner.take_group(stages, 0).names == ("ref",)


def test_stages_on_other_worker_groups_or_plans_or_reading_an_output_run_apart():
    runner = StageRunner(Dock({"late": "other-plan"}), {"actor": Workers("a"), "critic": Workers("c")})
    assert _names(runner, [dp("a1", outputs=["x"]), dp("c1", role="critic", outputs=["v"])]) == [("a1",), ("c1",)]
    assert _names(runner, [dp("a1", outputs=["x"]), dp("a2", inputs=["x"], outputs=["y"])]) == [("a1",), ("a2",)]
    assert _names(runner, [dp("a1", outputs=["x"]), dp("late", outputs=["y"])]) == [("a1",), ("late",)]
    # a stage reading none of the group's outputs still joins
    assert _names(runner, [dp("a1", outputs=["x"]), dp("a2", inputs=["p"], outputs=["y"])]) == [("a1", "a2")]


def test_run_takes_stages_in_order_and_passes_the_context_to_every_worker_call(figures, monkeypatch):
    dock, actor = Dock(), Workers("a")
    runner, driver = StageRunner(dock, {"actor": actor}), Driver()
    for name in ("prepare", "advantages"):  # driver rows run the function registered under their name
        monkeypatch.setitem(DRIVER_STAGES.functions, name, lambda trainer, stage: getattr(trainer, stage.name)(stage))
    stages = [driver_stage("prepare"), dp("rollout", outputs=["responses"], queued=True),
              dp("ref", inputs=["responses"], outputs=["r"]), dp("old", inputs=["responses"], outputs=["o"]),
              driver_stage("advantages")]
    metrics, ranks = runner.run(stages, driver, iteration=3, kl_coef=0.5)
    context = {"iteration": 3, "kl_coef": 0.5}
    assert driver.ran == ["prepare", "advantages"]
    assert metrics == {"driver/prepare": 1.0, "rollout/figure": 2.0, "driver/advantages": 1.0}
    assert actor.calls == [(("rollout",), context),
                           (("ref", "old"), "round-plan", ("batch0", "batch1"), context)]
    assert ranks == [{"rank": "aq"}, {"rank": "a0"}, {"rank": "a1"}]  # every rank's metrics of every DP stage
    assert dock.log == [("queue", ("rollout",)),
                        ("put_queued", ("rollout",), [1, 0], [([0], "made0"), ([1], "made1")]),
                        ("record", "queue-plan"),
                        ("dispatch", ("ref", "old")), ("put", ("ref", "old"), ("out0", "out1"))]
    assert figures == [("rollout", [1, 0], [{"rows": [0]}, {"rows": [1]}])]


def test_a_queued_stage_after_a_dp_stage_keeps_the_earlier_ranks_metrics(figures):
    dock, actor = Dock(), Workers("a")
    stages = [dp("ref", outputs=["r"], queued=False), dp("rollout", outputs=["x"], queued=True)]
    metrics, ranks = StageRunner(dock, {"actor": actor}).run(stages, Driver())
    assert ranks == [{"rank": "a0"}, {"rank": "a1"}, {"rank": "aq"}]
    assert [c[0] for c in actor.calls] == [("ref",), ("rollout",)]


def test_a_stage_without_outputs_is_not_put():
    dock = Dock()
    StageRunner(dock, {"actor": Workers("a")}).run([dp("train", inputs=["x"])], Driver())
    assert dock.log == [("dispatch", ("train",))]


def test_a_stage_on_a_role_without_workers_is_named():
    runner = StageRunner(Dock(), {"actor": Workers("a")})
    with pytest.raises(ValueError, match=r"^stage 'values' runs on role 'critic', which has no worker group$"):
        runner.workers(dp("values", role="critic"))


def test_an_empty_stage_group_is_refused():
    with pytest.raises(ValueError, match=r"^a stage group needs at least one stage$"):
        StageGroup(())
