"""``trainer_mode: colocate_async`` and ``separate_async``: the sync step over rounds from the rollout pipeline
(trainer/modes/pipeline.py). The engines sample ahead of the trainer with older weights; the modes differ in where
the engines run (beside the trainer ranks on their devices, or on devices of their own: cli/train_grpo.py) and in
their schedule (one step off, or ``parameter_sync_step`` and ``max_staleness``). Dynamic sampling draws its refills
from the pipeline as it draws fresh batches in sync."""
import time
from typing import Dict

from mindspeed_rl.plan.trainer_mode import COLOCATE, SEPARATE
from mindspeed_rl.trainer.modes.registry import register_mode
from mindspeed_rl.trainer.modes.sync import train_on
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics


class PipelineRounds:
    """Rounds of the batches the engines made (the rounds interface of trainer/modes/rounds.py)."""

    def __init__(self, trainer, iteration: int):
        self.trainer, self.iteration = trainer, iteration
        self.pipeline = trainer.pipeline
        self.results, self.taken, self._metrics = [], [], []
        self.waited = 0.0

    def next_round(self) -> None:
        made = self.pipeline.take(self.iteration)
        self.waited += self.pipeline.waited
        self.taken.append(made)
        self._metrics.append(dict(made.figures))
        self.results += made.results

    @property
    def seed_iteration(self) -> int:
        return self.taken[-1].index

    @property
    def train_round(self) -> int:
        return self.pipeline.round_of(self.taken[-1].index)

    def record(self, metrics: Dict[str, float], results) -> None:
        self._metrics[-1].update(metrics)
        self.results += results

    def metrics(self) -> Dict[str, float]:
        out = merge_rollout_metrics(self._metrics)
        out.update(self.pipeline.metrics(self.taken, self.iteration))
        out["async/trainer_wait_s"] = self.waited
        return out


def step(trainer, iteration: int, batch: dict) -> Dict[str, float]:
    start = time.perf_counter()
    trainer.took_batch(iteration)
    trainer.pipeline.feed(batch)
    rounds = PipelineRounds(trainer, iteration)
    metrics, results = train_on(trainer, rounds, iteration)
    out = trainer.finish_step(iteration, metrics, results, start)
    trainer.pipeline.trainer_span(trainer.pipeline.taken_at, f"train {iteration}")
    trainer.pipeline.after_update(iteration)
    trainer.logger.log_timeline(iteration, trainer.pipeline.timeline)
    trainer.pipeline.timeline = []
    out["async/sync_s"] = trainer.pipeline.sync_s
    out["async/weight_version"] = float(trainer.pipeline.version)  # what the engines sample with next
    out["timing/iteration"] += trainer.pipeline.sync_s  # the trainer waits for the gather of its weights
    out["async/trainer_idle_fraction"] = rounds.waited / max(out["timing/iteration"], 1e-9)
    return out


register_mode(COLOCATE)(step)
register_mode(SEPARATE)(step)
