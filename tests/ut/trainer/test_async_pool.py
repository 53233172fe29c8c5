"""Partial rollout under the async modes (trainer/modes/pool_pipeline.py) over stand-in engines (no Ray): at
max_staleness 0 the run is sync's partial rollout pass for pass; ahead of the trainer, passes run beside training
and rows carried across weight versions record each token's version; rows past the bound are counted, or dropped
on request; a checkpoint in the middle of a stream continues the same schedule."""
from pathlib import Path

import pytest
import torch

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.run_plan import PlanError
from mindspeed_rl.plan.stages import ROLLOUT, ROLLOUT_BUDGET, ROLLOUT_LOG_PROBS
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.trainer import partial_rollout
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.trainer.modes import async_modes, sync
from mindspeed_rl.trainer.modes.pool_pipeline import PoolPipeline, make_pipeline
from mindspeed_rl.trainer.stage_runner import StageGroup

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"
EOS = 0
SPLIT = "rl_config.partial_rollout_max_split=3"  # max_tokens 10: 4 new tokens a row per pass


def serve(prompts, budgets, iteration, version):
    """A row with prompt [L, k, tokens so far...] makes L tokens in all, the last one EOS; each token is 100 +
    the version that sampled it (EOS aside); log-probs follow the pass number."""
    out = []
    for prompt, budget in zip(prompts, budgets):
        natural, made = int(prompt[0]), prompt.numel() - 2
        n = min(int(budget), natural - made)
        tokens = torch.full((n,), 100 + version, dtype=torch.int32)
        if made + n == natural:
            tokens[-1] = EOS
        out.append(tokens)
    return out, [torch.full((t.numel(),), -0.01 * iteration) for t in out]


def batches(limit=200, spread=12):
    for k in range(limit):
        lengths = [(k * 8 + i) % spread + 3 for i in range(8)]  # natural lengths 3..14 (max_tokens 10)
        yield {"prompts": [torch.tensor([L, 20 + k], dtype=torch.int32) for L in lengths],
               "labels": [torch.tensor([L]) for L in lengths]}
    raise AssertionError(f"the test's data ran out after {limit} prompt batches")


def plan_of(*overrides):
    return build_configs(load_config(TINY, ["megatron_training.model_path=/unused", SPLIT, *overrides])).plan


class Engines:
    """Two engines; a pass is served when it is collected, by the version of the last load sent before it."""
    world_size = 2

    def __init__(self):
        self.log, self.finished, self.sampled = [], [], []
        self.running = self.most = 0  # passes started and not collected; the most at once

    def start_queued_stage(self, group, queued, iteration):
        self.log.append(("pass", iteration))
        self.running += 1
        self.most = max(self.most, self.running)
        return {"at": len(self.log) - 1, "queued": queued, "iteration": iteration, "outputs": group.outputs}

    def load_weights(self, state_ref, version):
        self.log.append(("load", version))
        return [("load", version)]

    def wait(self, refs, name):
        self.log.append(("wait", name, [v for _, v in refs]))

    def finish_stage(self, pending):
        queued = pending["queued"]
        loads = [e[1] for e in self.log[:pending["at"]] if e[0] == "load"]
        version = loads[-1] if loads else 0
        self.finished.append(pending["iteration"])
        self.running -= 1
        self.sampled.append((pending["iteration"], version))  # (pass, the weights that sampled it)
        made = []
        for consumer, rows in enumerate((queued.order[0::2], queued.order[1::2])):
            at = [queued.order.index(r) for r in rows]
            responses, log_probs = serve([queued.batch["prompts"][i] for i in at],
                                         [queued.batch[ROLLOUT_BUDGET][i] for i in at], pending["iteration"], version)
            out = {"responses": responses, "response_length": [torch.tensor([t.numel()]) for t in responses],
                   ROLLOUT_LOG_PROBS: log_probs}
            trace = {"rows": list(rows), "busy": 1.0, "latency": [1.0] * len(rows),
                     "trace": [[4, len(rows), 2 * len(rows), 1.0]], "consumer": consumer,
                     "span": (10.0 * pending["iteration"], 10.0 * pending["iteration"] + 4)}
            made.append(({c: out[c] for c in pending["outputs"]}, trace))
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
    """What the steps read of the trainer: sync's partial rollout runs the rollout stage on its own dock through
    the same stand-in; the train stages record what they got."""
    took_batch = RayGRPOTrainer.took_batch

    def __init__(self, *overrides, mode="separate_async", train_iters=6, data=None):
        self.run_plan = plan = plan_of(f"rl_config.trainer_mode={mode}", *overrides)
        self.transfer_dock = DriverDock(plan.dock_prompts, plan.n_samples, addition_columns=["labels"], run_plan=plan)
        self.dataset_additional_keys = ["labels"]
        self.carry_pool = partial_rollout.make_pool(plan, EOS, ["labels"])
        self.rollout_passes, self.data_position, self.train_iters = 0, None, train_iters
        self.groups = {"actor": Actor()}
        self.logger = Timeline()
        self.engines = Engines()
        self.pipeline = make_pipeline(self, self.engines, plan.asynchronous) if plan.asynchronous else None
        self.data_iter = data if data is not None else batches()
        self.trained = []

    def checked(self, batch):
        return batch

    def run_stages(self, stages, iteration):
        td = self.transfer_dock
        rows = list(range(td.round_rows()))
        if stages[0].name == ROLLOUT.name:  # sync: the same engines on the trainer's dock, version = passes - 1
            group = StageGroup.of(stages[0])
            pending = self.engines.start_queued_stage(group, td.queue_round(group), iteration=iteration)
            self.engines.log.insert(pending["at"], ("load", self.iteration - 1))
            pending["at"] += 1
            metrics, made = self.engines.finish_stage(pending)
            td.put_queued(group, pending["queued"].order, [(trace["rows"], out) for out, trace in made])
            return {}, metrics
        got = td.get_rows(["prompts", "responses", "labels", ROLLOUT_LOG_PROBS], rows)
        self.trained.append({"round": td.round, **{k: [v.tolist() for v in got[k]] for k in got}})
        return {}, []

    def finish_step(self, iteration, metrics, results, start):
        return dict(metrics, **{"timing/iteration": 0.5})

    def fit(self, first, last):
        if self.pipeline is not None and self.pipeline.state_ref is None:
            self.pipeline.push(self.groups["actor"].policy_state_ref(), first - 1)
        step = async_modes.step if self.pipeline is not None else sync.step
        history = []
        for k in range(first, last + 1):
            self.iteration = k
            history.append(step(self, k, next(self.data_iter)))
        return history


def loads_waited(log):
    """Each load in order, and whether it was waited for (by name)."""
    waited = set()
    for entry in log:
        if entry[0] == "wait":
            assert entry[1] == "load_weights"
            waited.update(entry[2])
    return [(e[1], e[1] in waited) for e in log if e[0] == "load"]


def versions(trained):
    """Per iteration: the sampling versions in its tokens (EOS aside)."""
    return [sorted({t - 100 for r in it["responses"] for t in r if t != EOS}) for it in trained]


def test_the_plan_allows_partial_rollout_but_not_a_pass_that_stops_on_the_pool():
    plan = plan_of("rl_config.trainer_mode=separate_async", "rl_config.max_staleness=2")
    assert plan.partial.pool_prompts == 16 and plan.asynchronous.ahead == 2  # sync's pool: two batches
    with pytest.raises(PlanError, match=r"^rl_config.trainer_mode=separate_async with rl_config.async_engine=true "
                                        r"is not implemented"):
        plan_of("rl_config.trainer_mode=separate_async", "rl_config.async_engine=true")
    tools = str(Path(__file__).resolve().parents[3] / "configs" / "tools" / "toy_secret.yaml")
    with pytest.raises(PlanError, match=r"^rl_config.trainer_mode=colocate_async with partial rollout of multi-turn "
                                        r"conversations .* is not implemented yet"):
        plan_of("rl_config.trainer_mode=colocate_async", "rl_config.multi_turn_enable=true",
                f"rl_config.tool_config_path={tools}", "rl_config.max_tool_calls=1", "rl_config.max_parallel_calls=1",
                "rl_config.max_total_response_length=12", "generate_config.sampling_config.max_tokens=4")


def test_max_staleness_0_is_sync_partial_rollout_pass_for_pass():
    for spread in (12, 2):  # 2: a pass completes every group, so some iterations need no pass
        synced = Trainer(mode="sync", data=batches(spread=spread))
        sync_history = synced.fit(1, 5)
        t = Trainer("rl_config.max_staleness=0", data=batches(spread=spread))
        history = t.fit(1, 5)
        same_as_sync(t, history, synced, sync_history)
    assert 0.0 in [m["partial_rollout/passes"] for m in sync_history]  # an iteration that needed no pass


def same_as_sync(t, history, synced, sync_history):
    assert isinstance(t.pipeline, PoolPipeline)
    assert t.trained == synced.trained  # the same rows, tokens, log-probs and labels, iteration by iteration
    assert t.rollout_passes == synced.rollout_passes and t.data_position == synced.data_position
    # the same passes, each sampled by the same weights (a pass runs only while too few groups are complete)
    assert t.engines.sampled == synced.engines.sampled
    for key in ("partial_rollout/continued_rows", "partial_rollout/token_age_max", "partial_rollout/passes",
                "partial_rollout/carried_rows"):
        assert [m[key] for m in history] == [m[key] for m in sync_history], key
    assert [m["async/staleness_max"] for m in history] == [m["partial_rollout/token_age_max"] for m in history]


def test_passes_run_ahead_and_every_token_records_its_weights():
    t = Trainer("rl_config.max_staleness=1", train_iters=8)
    history = t.fit(1, 8)
    # a pass runs beside every update after the first: one pass in flight beyond the one collected; while the
    # trainer waits, at most 1 + ahead passes run
    assert all(m["async/batches_ahead"] >= 1 for m in history[:-1])
    assert t.engines.most == 2
    # a pass's dock numbers its round as sync's partial rollout does (its planner's draws follow it)
    early = Trainer("rl_config.max_staleness=1", train_iters=8)
    early.fit(1, 3)
    assert early.pipeline.flight and all(p.dock.round == 2 * p.index + 1 for p in early.pipeline.flight)
    # tokens are sampled by the weights the engines held when their pass started; carried rows mix versions
    seen = versions(t.trained)
    assert seen[0] == [0] and any(len(v) > 1 for v in seen)
    for k, (v, m) in enumerate(zip(seen, history), start=1):
        assert max(v) <= k - 1  # never newer than the weights trained
        assert m["async/staleness_max"] == (k - 1) - min(v)  # the oldest token's age
    assert sum(m["async/stale_rows"] for m in history) > 0
    # without drop_stale_rows, rows past the bound are trained (with the correction) and counted
    over = [m["async/over_bound_rows"] for m in history]
    assert sum(over) > 0 and all(m["async/dropped_rows"] == 0 for m in history)
    assert all(m["async/over_bound_rows"] == 0 for m in history if m["async/staleness_max"] <= 1)
    # the weights go out after every update; each load is waited for with the first pass collected after it
    assert [e[1] for e in t.engines.log if e[0] == "load"] == list(range(0, 9))
    assert loads_waited(t.engines.log)[:-1] == [(v, True) for v in range(0, 8)]
    assert all(m["dp_balance/actor_rollout/stage_s"] == 1.0 for m in history)
    # the timeline names each pass collected in an iteration, on both engines
    passes = [sorted({s["what"] for s in spans if s["lane"] != "trainer"}) for _, spans in t.logger.records]
    assert [len(p) for p in passes] == [m["partial_rollout/passes"] for m in history]
    assert sum(passes, []) == [f"pass {k}" for k in range(1, len(sum(passes, [])) + 1)]


def test_drop_stale_rows_drops_the_groups_past_the_bound_and_counts_them():
    kept = Trainer("rl_config.max_staleness=1", train_iters=8)
    kept_history = kept.fit(1, 8)
    t = Trainer("rl_config.max_staleness=1", "rl_config.drop_stale_rows=true", train_iters=8)
    history = t.fit(1, 8)
    dropped = [m["async/dropped_rows"] for m in history]
    assert sum(dropped) > 0 and 0 in dropped and all(d % 4 == 0 for d in dropped)  # whole groups of 4 samples
    assert all(m["async/over_bound_rows"] == 0 and m["async/staleness_max"] <= 1 for m in history)
    assert 1 in [m["async/staleness_max"] for m in history]  # a group at the bound is kept
    for k, v in enumerate(versions(t.trained), start=1):
        assert min(v) >= k - 2  # every token at most one version old
    assert all(len(it["prompts"]) == 32 for it in t.trained)  # whole train batches all the same
    assert sum(m["async/over_bound_rows"] for m in kept_history) > 0


def test_a_checkpoint_in_the_middle_of_a_stream_continues_the_same_schedule():
    whole = Trainer("rl_config.max_staleness=2", "rl_config.parameter_sync_step=2", train_iters=7)
    whole.fit(1, 7)
    first = Trainer("rl_config.max_staleness=2", "rl_config.parameter_sync_step=2", train_iters=7)
    first.fit(1, 3)
    in_flight = [p.index for p in first.pipeline.flight]
    assert in_flight  # passes were running when the save came
    saved = first.pipeline.state(3, lambda ref: ("read", ref))
    pool = first.carry_pool.state_dict()
    assert [f["index"] for f in saved["flight"]] == in_flight and all(f["made"] for f in saved["flight"])
    assert saved["weights"] == ("read", ("weights", 2)) and saved["version"] == 2  # older than the trainer's
    data = batches()
    for _ in range(first.data_position):
        next(data)
    second = Trainer("rl_config.max_staleness=2", "rl_config.parameter_sync_step=2", train_iters=7, data=data)
    second.data_position, second.rollout_passes = first.data_position, first.rollout_passes
    second.carry_pool.load_state_dict(pool)
    second.pipeline.load(saved, 3, lambda state: ("put", state))
    assert second.engines.log == [("load", 2)] and second.pipeline.state_ref == ("put", ("read", ("weights", 2)))
    second.fit(4, 7)
    assert second.trained == whole.trained[3:]
    # the resumed passes keep their numbers (the timeline names them as the uninterrupted run did)
    def engine_work(t, first):
        return [s["what"] for k, spans in t.logger.records if k >= first for s in spans if s["lane"] == "engine 0"]
    assert engine_work(second, 4) == engine_work(whole, 4)
    with pytest.raises(ValueError, match=r"^the checkpoint's rollout pipeline was saved without partial rollout; "
                                         r"this run has it \(rl_config.partial_rollout_max_split must match"):
        Trainer("rl_config.max_staleness=2").pipeline.load({"ready": []}, 3, None)


def test_saved_at_a_sync_the_trainers_weights_go_out_and_nothing_is_read():
    t = Trainer("rl_config.max_staleness=2", "rl_config.parameter_sync_step=2", train_iters=6)
    t.fit(1, 2)
    state = t.pipeline.state(2, lambda ref: pytest.fail("weights read at a sync"))
    assert state["weights"] is None and state["version"] == 2
    again = Trainer("rl_config.max_staleness=2", "rl_config.parameter_sync_step=2", train_iters=6)
    assert again.pipeline.load(state, 2, lambda s: pytest.fail("nothing to put")) == len(state["flight"])
    assert again.engines.log == [("load", 2)] and again.pipeline.state_ref == ("weights", 1)


def test_a_prompt_batch_without_prompts_is_named():
    def data():
        yield from [next(batches())]
        while True:
            yield {"prompts": [], "labels": []}
    t = Trainer("rl_config.max_staleness=1", data=data())
    with pytest.raises(ValueError, match=r"^partial rollout: prompt batch 2 holds no prompts$"):
        t.fit(1, 1)


@pytest.mark.parametrize("staleness", [2, 3])
def test_engines_further_ahead_keep_the_pool_within_its_dock(staleness):
    # ahead 2 or 3 passes beside an update: the pool still holds at most two batches once the next one is fed
    t = Trainer(f"rl_config.max_staleness={staleness}", train_iters=8)
    history = t.fit(1, 8)
    assert all(len(it["prompts"]) == 32 for it in t.trained)
    assert max(m["async/staleness_max"] for m in history) >= 1
    assert t.carry_pool.groups <= t.run_plan.partial.pool_prompts
