"""The async modes' rollout pipeline (driver side): prompt batches go to the rollout engines ahead of the trainer,
finished batches wait in a buffer, and the trainer's weights go to the engines as numbered versions.

The schedule is a function of counts, never of timing, so a run repeats and resumes exactly (config_cls/
trainer_mode.AsyncSpec): before the trainer takes a batch, every batch up to ``ahead`` beyond it is started (none
beyond the last iteration); after update ``k`` the weights go out as version ``k`` when ``k`` is a multiple of
``parameter_sync_step`` (every update during the warm-up). A rank of the engine group runs its calls in the order
they were sent, so a weight load sent after a started batch reaches each engine when it is done with that batch:
every row is sampled by one version. A batch's rollout runs on a dock of its own (its queue, its balance figures)
and its rows move to the trainer's dock when the trainer takes it.
"""
import time
from collections import deque
from dataclasses import dataclass, field, fields
from typing import Dict, List, Optional

import numpy as np
import torch

from mindspeed_rl.plan.stages import ROLLOUT
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.balance.rollout_figures import rollout_figures

PIPELINE_FILE = "rollout_pipeline.pt"


@dataclass
class Launched:
    """A batch whose rollout runs on the engines."""
    index: int      # the batch's place in the data (1, 2, ...): its rollout seeds and round follow it
    version: int    # the weights that sample it
    dock: DriverDock
    queued: object  # its QueueRound (None: fixed shares, rl_config.rollout_balance 'static')
    pending: object
    loads: list     # weight loads sent before it (waited for with it)


@dataclass
class Made:
    """A finished batch in the buffer: its rows and what its rollout reported."""
    index: int
    version: int
    columns: Dict[str, list]
    results: List[Dict[str, float]]
    plans: List[dict]     # fixed shares: the rollout's plan
    queued: object = None  # a queued rollout: its round and its consumers' traces, for its balance figures,
    traces: list = None    # drawn on the trainer's dock when it takes the batch (its random draws as in sync)
    spans: List[List[float]] = field(default_factory=list)  # per engine: [start, end, engine] wall clock of its work
    figures: Dict[str, float] = field(default_factory=dict)  # the queue figures, once taken
    ages: Dict[str, float] = field(default_factory=dict)     # partial rollout: its tokens' staleness figures


class RolloutPipeline:
    def __init__(self, trainer, engines, spec):
        """``trainer``: the StageTableTrainer (its actor group makes the weights, its dock trains);
        ``engines``: the rollout engine group (launcher's RayActorGroup of RolloutEngineWorker)."""
        self.trainer, self.engines, self.spec = trainer, engines, spec
        self.pending: deque = deque()   # prompt batches taken from the data, not started yet
        self.flight: deque = deque()    # Launched, oldest first
        self.ready: deque = deque()     # Made, oldest first
        self.version = 0                # the weights the engines hold (0: the model's own)
        self.launched = 0               # index of the last batch started
        self.taken = 0                  # batches the trainer took
        self.loads: list = []           # weight loads sent since the last start
        self.state_ref = None           # the last weights sent (saved with a checkpoint when they are older)
        self.lengths = None             # the rollout queue's per-prompt prior, shared by every batch's dock
        self.sync_s = self.waited = 0.0
        self.depth = 0
        self.busy = 0.0                  # engines' busy seconds of every batch collected
        self.window = [np.inf, -np.inf]  # first start and last end of those batches (wall clock)
        self.timeline: List[dict] = []   # spans since the last iteration's record (timeline.jsonl)
        self.taken_at = 0.0              # wall clock of the last take's end: the trainer's update starts

    # ------------------------------------------------------------ data

    def feed(self, batch: dict) -> None:
        """A prompt batch the trainer took from the data (fit's batch of the iteration)."""
        self.pending.append(batch)

    def _next_batch(self) -> dict:
        trainer = self.trainer
        if self.pending:
            return self.pending.popleft()
        trainer.data_position += 1
        return next(trainer.data_iter)

    # ------------------------------------------------------------ schedule

    def ahead(self, iteration: int) -> int:
        """Batches started beyond the one the trainer takes next, in ``iteration``."""
        if iteration <= self.spec.warmup:
            return 0
        return max(0, min(self.spec.ahead, self.trainer.train_iters - iteration))

    def fill(self, iteration: int) -> None:
        """Start every batch up to ``ahead`` beyond the next one the trainer takes."""
        while self.launched < self.taken + 1 + self.ahead(iteration):
            self._launch(self._next_batch())

    def _launch(self, batch: dict) -> None:
        trainer, plan = self.trainer, self.trainer.run_plan
        index = self.launched + 1
        dock = DriverDock(plan.dock_prompts, plan.n_samples, addition_columns=trainer.dataset_additional_keys,
                          run_plan=plan)
        if self.lengths is None:
            self.lengths = dock.prompt_lengths
        dock.prompt_lengths = self.lengths
        dock.set_round(self.round_of(index) - 1)
        dock.start_round(trainer.checked(batch), trainer.dataset_additional_keys)
        stage = plan.stage(ROLLOUT.name)
        group = StageGroup.of(stage)
        if stage.queued:
            queued = dock.queue_round(group)
            pending = self.engines.start_queued_stage(group, queued, iteration=index)
        else:
            queued = None
            shares, *batches = dock.dispatch(group)
            pending = self.engines.start_stage(group, shares, batches, iteration=index)
        self.flight.append(Launched(index, self.version, dock, queued, pending, self.loads))
        self.loads = []
        self.launched = index

    def round_of(self, index: int) -> int:
        """The dock round of batch ``index`` (as the sync mode numbers it: with dynamic sampling a batch and its
        train round take two)."""
        return 2 * index - 1 if self.trainer.run_plan.group_filter is not None else index

    def _collect(self, launched: Launched) -> Made:
        engines, dock = self.engines, launched.dock
        if launched.loads:
            engines.wait(launched.loads, "load_weights")
        metrics, made = engines.finish_stage(launched.pending)
        stage = self.trainer.run_plan.stage(ROLLOUT.name)
        group = StageGroup.of(stage)
        traces, spans = None, []
        if launched.queued is not None:
            traces = [trace for _, trace in made]
            dock.put_queued(group, launched.queued.order, [(trace["rows"], out) for out, trace in made])
            spans = engine_spans(traces)
        else:
            dock.put_stage(group, *made)
        rows = list(range(dock.round_rows()))
        columns = [c for c in dock.experience_columns if len(dock.rows_with(c)) == len(rows)]
        got = dock.get_rows(columns, rows)
        queued = launched.queued._replace(batch=None) if launched.queued is not None else None
        return Made(launched.index, launched.version, {c: list(got[c]) for c in columns}, metrics,
                    dock.round_summary()["balance"], queued, traces, spans)

    def take(self, iteration: int) -> Made:
        """The oldest finished batch (started now if it was not: the warm-up, or dynamic sampling's refills);
        its rows go on the trainer's dock as round ``index``. Returns it; ``waited``: seconds the trainer
        waited for it."""
        self.fill(iteration)
        start, began = time.perf_counter(), time.time()
        if not self.ready:
            self.ready.append(self._collect(self.flight.popleft()))
        self.waited = time.perf_counter() - start
        while self.flight and self.engines.stage_done(self.flight[0].pending):  # finished meanwhile
            self.ready.append(self._collect(self.flight.popleft()))
        self.depth = len(self.ready)
        made = self.ready.popleft()
        self.taken += 1
        td = self.trainer.transfer_dock
        td.set_round(self.round_of(made.index) - 1)
        td.clear()
        td.put_experience(made.columns, list(range(len(made.columns["prompts"]))))
        for record in made.plans:
            td.record_plan(record)
        if made.queued is not None:
            made.figures, record = rollout_figures(td, self.trainer.run_plan.stage(ROLLOUT.name), made.queued,
                                                   made.traces)
            td.record_plan(record)
        self.engine_work(made.spans, f"batch {made.index}")
        self.trainer_span(began, "wait")
        return made

    def engine_work(self, spans: List[List[float]], what: str) -> None:
        """An engine's work collected: its busy seconds, the window, the timeline."""
        for start, end, engine in spans:
            self.busy += end - start
            self.window = [min(self.window[0], start), max(self.window[1], end)]
            self.timeline.append({"lane": f"engine {int(engine)}", "start": start, "end": end, "what": what})

    def trainer_span(self, began: float, what: str) -> None:
        """The trainer's span from ``began`` to now (wall clock) on the timeline."""
        self.taken_at = time.time()
        self.timeline.append({"lane": "trainer", "start": began, "end": self.taken_at, "what": what})

    def after_update(self, iteration: int) -> None:
        """Update ``iteration`` is done: its weights go to the engines when the schedule says so."""
        self.sync_s = 0.0
        if iteration % self.spec.sync_step and iteration > self.spec.warmup:
            return
        start, began = time.perf_counter(), time.time()
        self.push(self.trainer.groups["actor"].policy_state_ref(), iteration)
        self.sync_s = time.perf_counter() - start
        self.trainer_span(began, f"sync v{iteration}")

    def push(self, state_ref, version: int) -> None:
        self.state_ref, self.version = state_ref, int(version)
        self.loads += self.engines.load_weights(state_ref, self.version)

    # ------------------------------------------------------------ checkpoints

    def drain(self) -> None:
        """Every started batch into the buffer (before a save: what is saved is what the run continues from)."""
        while self.flight:
            self.ready.append(self._collect(self.flight.popleft()))

    def state(self, iteration: int, load_state) -> dict:
        """What a checkpoint after ``iteration`` keeps: the buffer, the batches taken but not started, the
        counts, and the engines' weights when they are older than the trainer's (``load_state``: reads them)."""
        self.drain()
        older = self.version != iteration
        return {"version": self.version, "launched": self.launched, "taken": self.taken,
                "ready": [{f.name: getattr(m, f.name) for f in fields(Made)} for m in self.ready],
                "pending": list(self.pending),
                "weights": load_state(self.state_ref) if older and self.state_ref is not None else None}

    def load(self, state: dict, iteration: int, put_state) -> int:
        """Continue from a checkpoint's ``state`` after ``iteration``: the engines get the weights they held
        (``put_state``: into the object store). Returns how many batches were made ahead."""
        self.launched, self.taken = int(state["launched"]), int(state["taken"])
        self.ready = deque(Made(**m) for m in state["ready"])
        self.pending = deque(state["pending"])
        self.restore_weights(state, iteration, put_state)
        return len(self.ready)

    def restore_weights(self, state: dict, iteration: int, put_state) -> None:
        """The engines get the weights of a checkpoint's ``state``: the saved ones when they were older than the
        trainer's, else the trainer's own (after ``iteration``)."""
        if state["weights"] is not None:
            self.push(put_state(state["weights"]), int(state["version"]))
        else:
            self.push(self.trainer.groups["actor"].policy_state_ref(), iteration)

    # ------------------------------------------------------------ metrics

    def metrics(self, taken: List[Made], iteration: int) -> Dict[str, float]:
        """Staleness of the rows taken in ``iteration`` (weight versions between the sampling weights and the
        trained ones, every token of a row alike), the buffer, the sync, the engines' idle fraction."""
        versions = np.array([m.version for m in taken], dtype=np.float64)
        rows = np.array([len(m.columns["prompts"]) for m in taken], dtype=np.float64)
        stale = (iteration - 1) - versions
        out = {"async/staleness_mean": float((stale * rows).sum() / rows.sum()),
               "async/staleness_max": float(stale.max()),
               "async/stale_rows": float(rows[stale > 0].sum()),
               "async/over_bound_rows": float(rows[stale > self.spec.max_staleness].sum()),
               "async/buffer_depth": float(self.depth), "async/batches_ahead": float(self.launched - self.taken)}
        window = self.window[1] - self.window[0]
        if window > 0:  # over the run so far: from the first batch's start to the last collected one's end
            out["async/engine_idle_fraction"] = float(max(0.0, 1.0 - self.busy / (self.engines.world_size * window)))
        return out


def save_pipeline(trainer, folder: str, iteration: int) -> None:
    import os

    import ray
    state = trainer.pipeline.state(iteration, ray.get)
    torch.save(state, os.path.join(folder, PIPELINE_FILE))


def load_pipeline(trainer, folder: str) -> Optional[int]:
    """The pipeline of checkpoint ``folder`` (its buffered batches), or None when the checkpoint has none."""
    import os

    import ray
    path = os.path.join(folder, PIPELINE_FILE)
    if not os.path.exists(path):
        return None
    state = torch.load(path, weights_only=False)
    return trainer.pipeline.load(state, trainer.iteration, ray.put)


def engine_spans(traces) -> List[List[float]]:
    """[start, end, engine] of each engine's part of a stage (its traces come in rank order)."""
    return [[float(t["span"][0]), float(t["span"][1]), k] for k, t in enumerate(traces) if "span" in t]
