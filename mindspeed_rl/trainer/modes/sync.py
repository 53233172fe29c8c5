"""``trainer_mode: sync``: rollout, then training, each iteration.

Without partial rollout or dynamic sampling an iteration is one dock round running every stage of the table in
order. With them, rounds come from partial rollout's pool (or fresh batches), dynamic sampling keeps the groups
whose rewards vary across as many rounds as it needs, and the rest of the table trains on what was made."""
import time
from typing import Dict

from mindspeed_rl.plan.stages import ROLLOUT
from mindspeed_rl.trainer import dynamic_sampling
from mindspeed_rl.trainer.modes.registry import register_mode
from mindspeed_rl.trainer.modes.rounds import BatchRounds
from mindspeed_rl.trainer.partial_rollout import PoolRounds
from mindspeed_rl.trainer.utils.batch_metrics import sum_by_rank


def train_rounds(trainer, iteration: int, batch: dict):
    """The iteration's source of rollout rounds: partial rollout's pool, or fresh prompt batches."""
    return (PoolRounds if trainer.carry_pool is not None else BatchRounds)(trainer, iteration, batch)


@register_mode("sync")
def step(trainer, iteration: int, batch: dict) -> Dict[str, float]:
    plan, td = trainer.run_plan, trainer.transfer_dock
    start = time.perf_counter()
    if trainer.carry_pool is None and plan.group_filter is None:
        trainer.took_batch(iteration)
        td.start_round(trainer.checked(batch), trainer.dataset_additional_keys)
        metrics, results = trainer.run_stages(list(plan.stages.values()), iteration=iteration)
        return trainer.finish_step(iteration, metrics, results, start)
    metrics, results = train_on(trainer, train_rounds(trainer, iteration, batch), iteration)
    return trainer.finish_step(iteration, metrics, results, start)


def train_on(trainer, rounds, iteration: int):
    """The rows of ``rounds`` (a round, or dynamic sampling's kept groups of several) through the rest of the stage
    table: (metrics, every rank's results, the rounds' included). Every mode's step ends here."""
    plan = trainer.run_plan
    if plan.group_filter is not None:
        made = dynamic_sampling.fill(trainer, rounds, iteration)
        train = plan.phase_stages("train")
    else:
        rounds.next_round()
        made = {}
        train = [s for s in plan.stages.values() if s.name != ROLLOUT.name]
    metrics, results = trainer.run_stages(train, iteration=iteration)
    metrics.update(rounds.metrics())
    metrics.update(made)
    return metrics, sum_by_rank(rounds.results) + results
