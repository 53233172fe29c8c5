"""Partial rollout under an async mode: the engines run the carry pool's passes ahead of the trainer.

The unit the engines run is a pass over the pool's incomplete rows that no pass in flight holds (trainer/
partial_rollout.py's pass: at most ``pass_tokens`` new tokens a row). A pass runs with the weights the engines hold
when it starts; a weight load sent after it reaches each engine when that engine is done with it, so a row is cut
at its pass's end and continued with newer weights by a later pass: each token records the weights that sampled it
(``born`` = version + 1, the iteration those weights train in sync, so a token's age is its staleness).

The schedule is a function of counts: before the trainer takes a round, the pool is topped up (the fed batch, then
whole batches while they fit) and passes are started until ``1 + ahead`` run; the oldest pass is collected only
while fewer than ``global_batch_size`` groups are complete, and more are started after a collect only then. A pass
is never collected because it happened to finish early. With ``max_staleness: 0`` this is sync's partial rollout
pass for pass. Groups holding a token older than ``max_staleness`` versions are trained with the rollout
correction, or dropped with ``drop_stale_rows``; both are counted.
"""
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from mindspeed_rl.plan.stages import ROLLOUT, ROLLOUT_LOG_PROBS
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.trainer.modes.pipeline import Made, RolloutPipeline, engine_spans
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics
from mindspeed_rl.balance.rollout_figures import rollout_figures


@dataclass
class Pass:
    """A pass the engines run (``made``: its outputs, once collected)."""
    index: int      # pass count: its dock round and sampling seeds follow it
    version: int    # the weights that sample it
    keys: list      # the pool rows it continues (CarryPool.keys), in its dock's row order
    dock: object = None
    queued: object = None
    pending: object = None
    loads: Optional[list] = None
    made: Optional[dict] = None


class PoolPipeline(RolloutPipeline):
    def __init__(self, trainer, engines, spec):
        super().__init__(trainer, engines, spec)
        self.pool = trainer.carry_pool
        self.collected: List[dict] = []  # passes collected since the last take

    def round_of(self, index: int) -> int:
        """The trainer's round of a take after ``index`` passes (as sync's partial rollout numbers it)."""
        return 2 * index + 1

    # ------------------------------------------------------------ schedule

    def _top_up(self) -> None:
        """The fed batches, then whole batches while the pool has room for one (sync's rule)."""
        pool, spec, trainer = self.pool, self.trainer.run_plan.partial, self.trainer
        while self.pending:
            pool.add(trainer.checked(self.pending.popleft()))
        while pool.groups + spec.train_prompts <= spec.pool_prompts:
            before = pool.groups
            pool.add(trainer.checked(self._next_batch()))
            if pool.groups == before:
                raise ValueError(f"partial rollout: prompt batch {trainer.data_position} holds no prompts")

    def _free_rows(self) -> List[int]:
        busy = {k for p in self.flight for k in p.keys}
        keys = self.pool.keys()
        return [i for i in self.pool.pass_rows() if keys[i] not in busy]

    def fill(self, iteration: int, beside: bool = False) -> None:
        """Start passes over the free rows until ``1 + ahead`` run while the trainer waits, or ``ahead`` run
        ``beside`` its update (the pool is not topped up beside an update: the next iteration's batch is not fed
        yet, and groups that wait for a take age)."""
        limit = self.ahead(iteration) + (0 if beside else 1)
        while len(self.flight) < limit:
            rows = self._free_rows()
            if not rows:
                return
            self._launch_pass(rows)

    def _launch_pass(self, rows: List[int]) -> None:
        trainer, plan, pool = self.trainer, self.trainer.run_plan, self.pool
        trainer.rollout_passes += 1
        index = trainer.rollout_passes
        dock = DriverDock(plan.dock_prompts, plan.n_samples, run_plan=plan)  # a pass's inputs: prompts and budgets
        dock.set_round(2 * index)
        dock.clear()
        dock.put_experience(pool.pass_inputs(rows), list(range(len(rows))))
        dock.set_queue_groups(*pool.pass_groups(rows))
        queued = dock.queue_round(StageGroup.of(plan.stage(ROLLOUT.name)))
        pending = self.engines.start_queued_stage(StageGroup.of(plan.stage(ROLLOUT.name)), queued, iteration=index)
        keys = pool.keys()
        self.flight.append(Pass(index, self.version, [keys[i] for i in rows], dock, queued, pending, self.loads))
        self.loads = []

    def _finish(self, p: Pass) -> dict:
        """Wait for pass ``p``; its outputs in dock row order, its metrics, figures and engine spans."""
        if p.made is not None:
            return p.made
        if p.loads:
            self.engines.wait(p.loads, "load_weights")
        metrics, made = self.engines.finish_stage(p.pending)
        stage = self.trainer.run_plan.stage(ROLLOUT.name)
        traces = [trace for _, trace in made]
        p.dock.put_queued(StageGroup.of(stage), p.queued.order, [(trace["rows"], out) for out, trace in made])
        figures, record = rollout_figures(p.dock, stage, p.queued, traces)
        got = p.dock.get_rows(list(stage.outputs), list(range(len(p.keys))))  # put_queued checked: every row made
        p.made = {"columns": {c: list(got[c]) for c in stage.outputs}, "results": metrics,
                  "figures": figures, "record": record, "spans": engine_spans(traces)}
        p.dock = p.queued = p.pending = None
        return p.made

    def _collect(self) -> None:
        """The oldest pass's rows into the pool, sampled by its weights."""
        p = self.flight[0]
        made = self._finish(p)
        where = {k: i for i, k in enumerate(self.pool.keys())}
        cols = made["columns"]
        self.pool.extend([where[k] for k in p.keys], cols["responses"], cols.get(ROLLOUT_LOG_PROBS), p.version + 1)
        self.flight.popleft()
        self.collected.append(made)
        self.engine_work(made["spans"], f"pass {p.index}")

    def _drop_stale(self, iteration: int) -> int:
        """Complete groups holding a token older than max_staleness versions, dropped; returns their rows."""
        ages = self.pool.oldest(self.pool.complete_groups(), iteration)
        old = [g for g, age in ages.items() if age > self.spec.max_staleness]
        return self.pool.drop(old)

    def take(self, iteration: int) -> Made:
        """``global_batch_size`` complete groups from the pool (passes collected, oldest first, while fewer are
        complete) onto the trainer's dock as one round."""
        pool, spec, td = self.pool, self.trainer.run_plan.partial, self.trainer.transfer_dock
        self._top_up()
        start, began = time.perf_counter(), time.time()
        dropped = 0
        while True:
            if self.spec.drop_stale:
                dropped += self._drop_stale(iteration)
            if len(pool.complete_groups()) >= spec.train_prompts:
                break
            # passes only while groups are short (as sync); dropped groups make room for fresh batches
            if dropped:
                self._top_up()
            self.fill(iteration)
            if not self.flight:
                raise RuntimeError(f"partial rollout: the pool holds {pool.groups} prompts, all complete, fewer "
                                   f"than the {spec.train_prompts} an iteration trains (global_batch_size); "
                                   f"the prompt batches were smaller than global_batch_size")
            self._collect()
        self.waited = time.perf_counter() - start
        self.trainer_span(began, "wait")
        chosen = pool.complete_groups()[:spec.train_prompts]
        ages = pool.oldest(chosen, iteration)
        n = self.trainer.run_plan.n_samples
        columns, take_metrics = pool.take(spec.train_prompts, iteration)
        if ROLLOUT_LOG_PROBS not in td.experience_columns:
            columns.pop(ROLLOUT_LOG_PROBS)
        self.taken += 1
        self.depth = len(pool.complete_groups())
        index = self.trainer.rollout_passes
        self.fill(iteration, beside=True)  # what the engines run while the trainer trains on this take
        td.set_round(self.round_of(index))
        td.clear()
        td.put_experience(columns, list(range(len(columns["prompts"]))))
        passes, self.collected = self.collected, []
        for made in passes:
            td.record_plan(made["record"])
        figures = merge_rollout_metrics([m["figures"] for m in passes])
        figures.update(take_metrics)
        figures["partial_rollout/passes"] = float(len(passes))
        stale = {"rows": float(len(columns["prompts"])),
                 "token_age_mean": take_metrics["partial_rollout/token_age_mean"],
                 "token_age_max": take_metrics["partial_rollout/token_age_max"],
                 "stale_rows": float(n * sum(age > 0 for age in ages.values())),
                 "over_bound_rows": float(n * sum(age > self.spec.max_staleness for age in ages.values())),
                 "dropped_rows": float(dropped)}
        return Made(index, self.version, columns, [r for m in passes for r in m["results"]],
                    [], figures=figures, ages=stale)

    # ------------------------------------------------------------ checkpoints

    def drain(self) -> None:
        """Every pass in flight finished (its outputs held, not yet in the pool: a resume collects them where
        the uninterrupted run would)."""
        for p in self.flight:
            self._finish(p)

    def state(self, iteration: int, load_state) -> dict:
        self.drain()
        older = self.version != iteration
        return {"version": self.version, "taken": self.taken, "pending": list(self.pending),
                "flight": [{"index": p.index, "version": p.version, "keys": p.keys, "made": p.made}
                           for p in self.flight],
                "weights": load_state(self.state_ref) if older and self.state_ref is not None else None}

    def load(self, state: dict, iteration: int, put_state) -> int:
        """Continue ``state`` (RolloutPipeline.load); returns how many passes were running at the save."""
        if "flight" not in state:
            raise ValueError("the checkpoint's rollout pipeline was saved without partial rollout; this run has it "
                             "(rl_config.partial_rollout_max_split must match to continue)")
        self.taken = int(state["taken"])
        self.flight.extend(Pass(f["index"], f["version"], f["keys"], made=f["made"]) for f in state["flight"])
        self.pending.extend(state["pending"])
        self.restore_weights(state, iteration, put_state)
        return len(self.flight)

    # ------------------------------------------------------------ metrics

    def metrics(self, taken: List[Made], iteration: int) -> Dict[str, float]:
        """Token staleness of the rows taken in ``iteration`` (its age: weight versions between the sampling
        weights and the trained ones), rows stale, over the bound, dropped, the pool's waiting groups."""
        ages = [m.ages for m in taken]
        rows = sum(a["rows"] for a in ages)
        out = {"async/staleness_mean": sum(a["token_age_mean"] * a["rows"] for a in ages) / max(rows, 1.0),
               "async/staleness_max": max(a["token_age_max"] for a in ages),
               "async/stale_rows": sum(a["stale_rows"] for a in ages),
               "async/over_bound_rows": sum(a["over_bound_rows"] for a in ages),
               "async/dropped_rows": sum(a["dropped_rows"] for a in ages),
               "async/buffer_depth": float(self.depth), "async/batches_ahead": float(len(self.flight))}
        window = self.window[1] - self.window[0]
        if window > 0:
            out["async/engine_idle_fraction"] = float(max(0.0, 1.0 - self.busy / (self.engines.world_size * window)))
        return out


def make_pipeline(trainer, engines, spec) -> RolloutPipeline:
    """The run's pipeline: of passes over the carry pool with partial rollout, else of prompt batches."""
    return (PoolPipeline if trainer.carry_pool is not None else RolloutPipeline)(trainer, engines, spec)
