"""The async modes' rollout pipeline over a stand-in engine group (no Ray): which weight version samples each batch,
when weights go out, what the trainer takes, staleness and idle figures, and a checkpoint's state continuing the
same schedule. The stand-in keeps the engines' call order as Ray keeps it (a load sent after a started batch
reaches an engine after that batch), and each engine writes the version it holds into every token it makes."""
import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import ROLLOUT
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.trainer.modes import async_modes
from mindspeed_rl.trainer.modes.pipeline import Made, RolloutPipeline

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"


class Engines:
    """Two engines; a started batch is served when it is finished, with the version of the last load sent before
    it; row r of a batch of prompts [L, k] gets L tokens, each the version + 100."""
    world_size = 2

    def __init__(self):
        self.log, self.waited, self.finished, self.states = [], [], [], []
        self.instant = True  # every started batch is done at once (False: only when the trainer waits for it)

    def start_queued_stage(self, group, queued, iteration):
        self.log.append(("batch", iteration))
        return {"at": len(self.log) - 1, "queued": queued, "iteration": iteration, "outputs": group.outputs}

    def load_weights(self, state_ref, version):
        self.log.append(("load", version))
        self.states.append(state_ref)
        return [("load", version, 0), ("load", version, 1)]

    def wait(self, refs, name):
        self.waited.append((name, [r[1] for r in refs]))

    def stage_done(self, pending):
        assert pending["iteration"] in [kind_arg[1] for kind_arg in self.log if kind_arg[0] == "batch"]
        return self.instant

    def version_at(self, at: int) -> int:
        loads = [v for kind, v in self.log[:at] if kind == "load"]
        return loads[-1] if loads else 0

    def finish_stage(self, pending):
        queued, version = pending["queued"], self.version_at(pending["at"])
        self.finished.append(pending["iteration"])
        made = []
        for consumer, rows in enumerate((queued.order[0::2], queued.order[1::2])):
            prompts = [queued.batch["prompts"][queued.order.index(r)] for r in rows]
            responses = [torch.full((int(p[0]),), 100 + version, dtype=torch.int32) for p in prompts]
            out = {"responses": responses, "response_length": [torch.tensor([t.numel()]) for t in responses],
                   "rollout_log_probs": [torch.zeros(t.numel()) for t in responses]}
            out = {c: out[c] for c in pending["outputs"]}
            trace = {"rows": list(rows), "busy": 1.0, "latency": [1.0] * len(rows),
                     "trace": [[max(t.numel() for t in responses), len(rows), 2 * len(rows), 1.0]],
                     "consumer": consumer, "span": (10.0 * pending["iteration"], 10.0 * pending["iteration"] + 4)}
            made.append((out, trace))
        return [{"rank": 0.0, "timing/actor_rollout": 1.0}, {"rank": 1.0, "timing/actor_rollout": 1.0}], made


class Timeline:
    """The logger's timeline records: (iteration, spans) per iteration."""

    def __init__(self):
        self.records = []

    def log_timeline(self, iteration, spans):
        self.records.append((iteration, list(spans)))


class Actor:
    def __init__(self):
        self.states = 0

    def policy_state_ref(self):
        self.states += 1
        return ("weights", self.states)


class Trainer:
    """What the async step reads of the trainer; the train stages record the rows they got."""
    took_batch = RayGRPOTrainer.took_batch

    def __init__(self, *overrides, train_iters=5, data=None):
        self.run_plan = build_configs(load_config(TINY, ["megatron_training.model_path=/unused",
                                                         "rl_config.trainer_mode=separate_async",
                                                         *overrides])).plan
        plan = self.run_plan
        self.transfer_dock = DriverDock(plan.dock_prompts, plan.n_samples, addition_columns=["labels", "source"],
                                        run_plan=plan)
        self.dataset_additional_keys = ["labels", "source"]
        self.train_iters, self.data_position = train_iters, 0
        self.groups = {"actor": Actor()}
        self.logger = Timeline()
        self.engines = Engines()
        self.pipeline = RolloutPipeline(self, self.engines, plan.asynchronous)
        self.data_iter = data if data is not None else batches()
        self.trained, self.rollout_rounds = [], []
        launch = self.pipeline._launch

        def recorded(batch):  # the round of each batch's dock
            launch(batch)
            self.rollout_rounds.append(self.pipeline.flight[-1].dock.round)
        self.pipeline._launch = recorded

    def checked(self, batch):
        return batch

    def run_stages(self, stages, iteration):
        assert ROLLOUT.name not in [s.name for s in stages]  # the engines made the rows
        td = self.transfer_dock
        got = td.get_rows(["prompts", "responses", "labels", "source"], list(range(td.round_rows())))
        # the dataset's columns came along with the batch (the rewards read them)
        assert [int(label) for label in got["labels"]] == [int(p[0]) for p in got["prompts"]]
        assert [int(x) for x in got["source"]] == [int(p[1]) for p in got["prompts"]]
        self.trained.append((iteration, td.round, [int(p[1]) for p in got["prompts"]],
                             sorted({int(t) for r in got["responses"] for t in r})))
        return {}, []

    def finish_step(self, iteration, metrics, results, start):
        assert iteration == self.iteration  # took_batch's
        return dict(metrics, **{"timing/iteration": 0.5, "ranks": float(len(results))})

    def fit(self, first, last):
        if self.pipeline.state_ref is None:
            self.pipeline.push(self.groups["actor"].policy_state_ref(), first - 1)
        return [async_modes.step(self, k, next(self.data_iter)) for k in range(first, last + 1)]


def batches(limit=100):
    for k in range(1, limit):  # prompt [L, k]: batch k's rows answer L tokens
        lengths = [(k + i) % 5 + 1 for i in range(8)]
        yield {"prompts": [torch.tensor([L, k], dtype=torch.int32) for L in lengths],
               "labels": [torch.tensor([L]) for L in lengths], "source": [torch.tensor([k]) for _ in lengths]}
    raise AssertionError("the test's data ran out")


def trained_versions(t):
    """(batch of the rows trained, the version that sampled them) per iteration."""
    out = []
    for _, _, prompts, tokens in t.trained:
        assert len(set(prompts)) == 1 and len(tokens) == 1  # one batch per iteration, one version per batch
        out.append((prompts[0], tokens[0] - 100))
    return out


def test_separate_async_runs_batches_ahead_and_syncs_every_parameter_sync_step():
    t = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2")
    history = t.fit(1, 5)
    # batches in data order, each sampled by the version the engines held when it started
    assert trained_versions(t) == [(1, 0), (2, 0), (3, 0), (4, 2), (5, 2)]
    assert [m["async/staleness_max"] for m in history] == [0, 1, 2, 1, 2]
    assert [m["async/staleness_mean"] for m in history] == [0, 1, 2, 1, 2]
    assert [m["async/stale_rows"] for m in history] == [0, 32, 32, 32, 32]
    assert all(m["async/over_bound_rows"] == 0 for m in history)
    # weights go out after updates 2 and 4 (and the starting weights before iteration 1)
    assert [e for e in t.engines.log if e[0] == "load"] == [("load", 0), ("load", 2), ("load", 4)]
    assert t.engines.states == [("weights", 1), ("weights", 2), ("weights", 3)]  # each push's own gather
    assert [m["async/weight_version"] for m in history] == [0, 2, 2, 4, 4]
    # max_staleness 2 with a sync every 2 updates: one batch ahead, none beyond the last iteration; the data
    # position counts every batch taken
    assert [m["async/batches_ahead"] for m in history] == [1, 1, 1, 1, 0]
    assert t.pipeline.launched == 5 and t.engines.finished == [1, 2, 3, 4, 5]
    # the last iteration's batch from the data waits (a checkpoint keeps it): taken, not started
    assert t.data_position == 6 and [int(b["prompts"][0][1]) for b in t.pipeline.pending] == [6]
    # the trainer's dock numbers a batch's round as sync does; the rows are the batch's 8 prompts x 4 samples
    assert [r for _, r, _, _ in t.trained] == [1, 2, 3, 4, 5]
    assert t.rollout_rounds == [1, 2, 3, 4, 5]  # and so does the batch's own dock (its random draws)
    assert history[0]["ranks"] == 2.0 and history[0]["async/trainer_wait_s"] >= 0
    # a load is waited for with the first batch started after it
    assert t.engines.waited == [("load_weights", [0, 0]), ("load_weights", [2, 2])]
    # each batch's queue figures, drawn on the trainer's dock when it took the batch
    for m in history:
        assert m["dp_balance/actor_rollout/rows/rank0"] + m["dp_balance/actor_rollout/rows/rank1"] == 32
        assert m["dp_balance/actor_rollout/stage_s"] == 1.0


def test_max_staleness_0_is_sync_and_one_step_off_is_colocate():
    t = Trainer("rl_config.max_staleness=0", train_iters=4)
    t.fit(1, 4)
    assert trained_versions(t) == [(1, 0), (2, 1), (3, 2), (4, 3)]
    c = Trainer("rl_config.trainer_mode=colocate_async", train_iters=4)
    history = c.fit(1, 4)
    assert trained_versions(c) == [(1, 0), (2, 0), (3, 1), (4, 2)]
    assert [m["async/staleness_max"] for m in history] == [0, 1, 1, 1]


def test_the_warmup_runs_in_step_then_the_engines_run_ahead():
    t = Trainer("rl_config.num_warmup_batches=2", "rl_config.parameter_sync_step=2", "rl_config.max_staleness=2",
                train_iters=6)
    history = t.fit(1, 6)
    # iterations 1-2 sync every update and start nothing ahead; then one ahead, a sync every second update
    assert trained_versions(t) == [(1, 0), (2, 1), (3, 2), (4, 2), (5, 2), (6, 4)]
    assert [m["async/batches_ahead"] for m in history] == [0, 0, 1, 1, 1, 0]
    # a warm-up of one: update 1 syncs although 1 is not a multiple of parameter_sync_step
    odd = Trainer("rl_config.num_warmup_batches=1", "rl_config.parameter_sync_step=2", "rl_config.max_staleness=2",
                  train_iters=4)
    odd.fit(1, 4)
    assert [e for e in odd.engines.log if e[0] == "load"] == [("load", 0), ("load", 1), ("load", 2), ("load", 4)]


def test_a_checkpoints_state_continues_the_same_schedule():
    whole = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6)
    whole.fit(1, 6)
    first = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6)
    first.engines.instant = False
    first.fit(1, 3)
    assert [f.index for f in first.pipeline.flight] == [4]  # still running when the save comes
    saved = first.pipeline.state(3, lambda ref: ("read", ref))
    assert not first.pipeline.flight and first.engines.finished[-1] == 4  # the save waited for it
    # after update 3 the engines hold version 2: their weights are saved; batch 4 was made ahead (with them)
    assert saved["weights"] == ("read", ("weights", 2)) and saved["version"] == 2
    assert [(m["index"], m["version"]) for m in saved["ready"]] == [(4, 2)] and saved["pending"] == []
    assert (saved["launched"], saved["taken"]) == (4, 3)
    data = batches()
    for _ in range(first.data_position):  # the resumed data iterator starts after the batches taken
        next(data)
    second = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6, data=data)
    second.data_position = first.data_position
    second.pipeline.load(saved, 3, lambda state: ("put", state))
    assert second.engines.log == [("load", 2)] and second.pipeline.state_ref == ("put", ("read", ("weights", 2)))
    second.fit(4, 6)
    assert trained_versions(second) == trained_versions(whole)[3:]
    assert second.trained == whole.trained[3:]
    # saved at a sync: the trainer's own weights go out, nothing is read
    at_sync = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6)
    at_sync.fit(1, 2)
    state = at_sync.pipeline.state(2, lambda ref: pytest.fail("weights read at a sync"))
    assert state["weights"] is None and [m["index"] for m in state["ready"]] == [3]
    again = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6)
    again.pipeline.load(state, 2, lambda s: pytest.fail("nothing to put"))
    assert again.engines.log == [("load", 2)] and again.pipeline.state_ref == ("weights", 1)


def test_staleness_beyond_the_bound_and_engine_idle_figures():
    t = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2")
    made = [Made(1, 0, {"prompts": [0] * 32}, [], []), Made(2, 3, {"prompts": [0] * 32}, [], []),
            Made(3, 5, {"prompts": [0] * 16}, [], [])]
    t.pipeline.depth = 1
    m = t.pipeline.metrics(made, 7)  # trained with version 6: 6, 3 and 1 versions old
    assert m["async/staleness_max"] == 6 and m["async/staleness_mean"] == pytest.approx((6 * 32 + 3 * 32 + 16) / 80)
    assert m["async/over_bound_rows"] == 64 and m["async/stale_rows"] == 80 and m["async/buffer_depth"] == 1
    assert "async/engine_idle_fraction" not in m  # no engine span yet
    t.pipeline.busy, t.pipeline.window = 12.0, [100.0, 110.0]  # 2 engines x 10 s, 12 s busy
    assert t.pipeline.metrics(made, 7)["async/engine_idle_fraction"] == pytest.approx(0.4)
    t.pipeline.busy, t.pipeline.window = 0.5, [100.0, 100.5]  # a short window counts too
    assert t.pipeline.metrics(made, 7)["async/engine_idle_fraction"] == pytest.approx(0.5)
    t.pipeline.busy, t.pipeline.window = 0.0, [100.0, 100.0]  # nothing measured yet
    assert "async/engine_idle_fraction" not in t.pipeline.metrics(made, 7)


def test_the_engine_spans_and_the_trainer_idle_fraction_of_a_run():
    t = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2")
    history = t.fit(1, 3)
    # each batch: both engines busy 4 s of the 10 s between starts; batches 1-3 collected by iteration 3
    assert t.pipeline.busy == pytest.approx(3 * 2 * 4.0) and t.pipeline.window == [10.0, 34.0]
    assert history[-1]["async/engine_idle_fraction"] == pytest.approx(1 - 24.0 / (2 * 24.0))
    assert all(0 <= m["async/trainer_idle_fraction"] <= 1 for m in history)
    assert all(0 <= m["async/sync_s"] < 60 for m in history)
    # a sync after update 2 only (parameter_sync_step 2): the others report none
    assert history[0]["async/sync_s"] == 0.0 == history[2]["async/sync_s"] < history[1]["async/sync_s"]
    # the rollout's balance record went to the trainer's dock with the batch
    assert [p["consumer"] for p in t.transfer_dock.round_summary()["balance"]] == ["actor_rollout"] * 3
    # the timeline of each iteration: each engine's batches collected in it, the trainer's wait, its stages and,
    # after update 2, the weights' gather
    records = t.logger.records
    assert [k for k, _ in records] == [1, 2, 3]
    engines = [[(s["lane"], s["start"], s["end"], s["what"]) for s in spans if s["lane"] != "trainer"]
               for _, spans in records]
    assert engines[0] == [("engine 0", 10.0, 14.0, "batch 1"), ("engine 1", 10.0, 14.0, "batch 1")]
    assert [w for spans in engines for _, _, _, w in spans] == ["batch 1"] * 2 + ["batch 2"] * 2 + ["batch 3"] * 2
    trainer = [[s["what"] for s in spans if s["lane"] == "trainer"] for _, spans in records]
    assert trainer == [["wait", "train 1"], ["wait", "train 2", "sync v2"], ["wait", "train 3"]]
    for _, spans in records:
        mine = [s for s in spans if s["lane"] == "trainer"]
        assert all(a["end"] <= b["start"] for a, b in zip(mine, mine[1:]))  # one after the other
        assert all(s["start"] <= s["end"] for s in mine)


def test_the_console_line_says_staleness_weights_and_wait():
    from mindspeed_rl.trainer.stage_trainer import async_summary
    t = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2")
    history = t.fit(1, 3)
    line = async_summary(history[2])
    assert line.startswith(" async: staleness=2.00/2 weights=v2 trainer_wait=") and line.endswith("s")
    assert async_summary({"reward/mean": 1.0}) == ""


class PlannedEngines(Engines):
    """Fixed shares (rl_config.guarantee_order): each DP rank gets its rows with the round's plan."""

    def start_stage(self, group, plan, batches, iteration):
        assert len(plan) == len(batches) == 2 and sum(len(s) for shares in plan for s in shares) == 32
        self.log.append(("batch", iteration))
        return {"at": len(self.log) - 1, "plan": plan, "batches": batches, "iteration": iteration,
                "outputs": group.outputs}

    def finish_stage(self, pending):
        if "plan" not in pending:
            return super().finish_stage(pending)
        version = self.version_at(pending["at"])
        self.finished.append(pending["iteration"])
        outputs = []
        for batch in pending["batches"]:
            responses = [torch.full((int(p[0]),), 100 + version, dtype=torch.int32) for p in batch["prompts"]]
            out = {"responses": responses, "response_length": [torch.tensor([t.numel()]) for t in responses],
                   "rollout_log_probs": [torch.zeros(t.numel()) for t in responses]}
            outputs.append({c: out[c] for c in pending["outputs"]})
        return [{"rank": 0.0}, {"rank": 1.0}], outputs


def test_fixed_shares_run_ahead_too():
    t = Trainer("rl_config.guarantee_order=true", train_iters=4)
    t.engines = PlannedEngines()
    t.pipeline = RolloutPipeline(t, t.engines, t.run_plan.asynchronous)
    history = t.fit(1, 4)
    assert trained_versions(t) == [(1, 0), (2, 0), (3, 1), (4, 2)]
    # the rollout's plan of fixed shares reached the trainer's dock with the batch; no queue figures
    assert all("dp_balance/actor_rollout/stage_s" not in m for m in history)
    assert t.engines.finished == [1, 2, 3, 4]
    plans = t.transfer_dock.round_summary()["balance"]
    assert len(plans) == 4 and all(p["consumer"] == "actor_rollout" for p in plans)


def test_the_pipeline_file_saves_and_loads_through_the_object_store(tmp_path, monkeypatch):
    import ray
    from mindspeed_rl.trainer.modes import pipeline
    monkeypatch.setattr(ray, "get", lambda ref: {"read": ref})
    monkeypatch.setattr(ray, "put", lambda value: ("put", value))
    first = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6)
    first.fit(1, 3)
    first.iteration = 3
    pipeline.save_pipeline(first, str(tmp_path), 3)
    assert (tmp_path / pipeline.PIPELINE_FILE).is_file() and not first.pipeline.flight  # drained first
    second = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6)
    second.iteration = 3
    assert pipeline.load_pipeline(second, str(tmp_path)) == 1  # batch 4, made ahead
    assert second.pipeline.state_ref == ("put", {"read": ("weights", 2)}) and second.pipeline.version == 2
    assert [m.index for m in second.pipeline.ready] == [4] and second.pipeline.launched == 4
    assert torch.equal(second.pipeline.ready[0].columns["responses"][0], first.pipeline.ready[0].columns["responses"][0])
    assert pipeline.load_pipeline(second, str(tmp_path / "elsewhere")) is None  # a checkpoint without one
    at_sync = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6)
    at_sync.fit(1, 2)
    at_sync.iteration = 2
    (tmp_path / "sync").mkdir()
    pipeline.save_pipeline(at_sync, str(tmp_path / "sync"), 2)
    assert torch.load(tmp_path / "sync" / pipeline.PIPELINE_FILE, weights_only=False)["weights"] is None
    again = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=6)
    again.iteration = 2
    pipeline.load_pipeline(again, str(tmp_path / "sync"))
    assert again.pipeline.version == 2 and again.engines.log == [("load", 2)]  # the trainer's own weights


def test_with_dynamic_sampling_a_batch_and_its_train_round_take_two_round_numbers():
    assert Trainer().pipeline.round_of(3) == 3
    dapo = Trainer("rl_config.filter_groups_enable=true", "rl_config.filter_groups_metric=length_match",
                   "rl_config.filter_groups_train_batch_size=8")
    assert [dapo.pipeline.round_of(i) for i in (1, 2, 3)] == [1, 3, 5]


class Waits:
    """A pipeline whose takes wait known seconds."""

    def __init__(self, waits):
        self.waits, self.waited = list(waits), 0.0

    def take(self, iteration):
        self.waited = self.waits.pop(0)
        return Made(len(self.waits), 0, {"prompts": [0]}, [{"rank": 0.0, "n": float(len(self.waits))}], [])

    def metrics(self, taken, iteration):
        return {"taken": float(len(taken))}


def test_rounds_add_up_their_waits_and_results():
    trainer = type("T", (), {"pipeline": Waits([0.5, 0.25])})()
    rounds = async_modes.PipelineRounds(trainer, 3)
    rounds.next_round()
    rounds.record({"a": 1.0}, [{"rank": 1.0}])
    rounds.next_round()
    assert rounds.waited == 0.75 and rounds.seed_iteration == 0
    assert rounds.results == [{"rank": 0.0, "n": 1.0}, {"rank": 1.0}, {"rank": 0.0, "n": 0.0}]
    assert rounds.metrics() == {"a": 1.0, "taken": 2.0, "async/trainer_wait_s": 0.75}


def test_the_step_counts_the_sync_in_the_iteration_and_the_wait_against_it():
    t = Trainer("rl_config.parameter_sync_step=2", "rl_config.max_staleness=2", train_iters=4)
    actor = t.groups["actor"]
    slow = actor.policy_state_ref

    def gather():
        time.sleep(0.05)
        return slow()
    actor.policy_state_ref = gather
    history = t.fit(1, 4)
    assert t.iteration == 4 and [k for k, _, _, _ in t.trained] == [1, 2, 3, 4]
    for k, m in enumerate(history, 1):
        synced = k % 2 == 0
        assert (m["async/sync_s"] >= 0.05) == synced
        assert m["timing/iteration"] == pytest.approx(0.5 + m["async/sync_s"])
        assert m["async/trainer_idle_fraction"] == pytest.approx(m["async/trainer_wait_s"] / m["timing/iteration"])
