"""Fresh rollout rounds: each ``next_round`` starts a dock round with the next prompt batch (the iteration's own
first) and runs the rollout stage on it. Dynamic sampling's refills draw from here; partial rollout's pool has its
own rounds (trainer/partial_rollout.py, ``PoolRounds``) with the same interface: ``next_round()``,
``seed_iteration``, ``train_round``, ``record()``, ``metrics()`` and ``results``."""
from typing import Dict

from mindspeed_rl.plan.stages import ROLLOUT
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics


class BatchRounds:
    def __init__(self, trainer, iteration: int, batch: dict):
        self.trainer, self.iteration, self.first = trainer, iteration, batch
        self.results, self._metrics = [], []

    @property
    def seed_iteration(self) -> int:
        """The rollout's seed follows the batch, not the iteration: a refill samples afresh."""
        return self.trainer.data_position

    def next_round(self) -> None:
        trainer, td = self.trainer, self.trainer.transfer_dock
        batch = self.first if self.first is not None else next(trainer.data_iter)
        self.first = None
        trainer.took_batch(self.iteration)
        # rounds numbered from the data position, so a resumed run draws the same random splits
        td.set_round(2 * trainer.data_position - 2)
        td.start_round(trainer.checked(batch), trainer.dataset_additional_keys)
        metrics, results = trainer.run_stages([trainer.run_plan.stage(ROLLOUT.name)], iteration=self.seed_iteration)
        self._metrics.append(metrics)
        self.results += results

    def record(self, metrics: Dict[str, float], results) -> None:
        """What the stages run on the latest round after the rollout reported (its metrics merge with the
        rollout's)."""
        self._metrics[-1].update(metrics)
        self.results += results

    @property
    def train_round(self) -> int:
        return 2 * self.trainer.data_position - 1

    def metrics(self) -> Dict[str, float]:
        return merge_rollout_metrics(self._metrics)
