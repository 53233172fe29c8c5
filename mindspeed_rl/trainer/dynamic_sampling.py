"""DAPO's dynamic sampling (rl_config.filter_groups_enable), under any megatron_training.stage.

An iteration runs the run plan's 'rollout' stages once per prompt batch: rollout, rewards, advantages, then
the filter stage, which drops the groups whose filter metric is the same for every sample and keeps the rest
on the driver. Batches are added until ``filter_groups_train_batch_size`` groups are kept (the surplus of the
last batch is dropped) or ``filter_groups_max_batches`` batches ran (then the kept groups are trained on, and
the shortfall is logged). The kept rows become a round of their own and the 'train' stages run on it: every
DP rank gets a balanced share of whatever row count is left (sizes differ by at most one row).
"""
import time
from collections import defaultdict
from typing import Dict

import torch

from mindspeed_rl.algorithms import register_stage
from mindspeed_rl.config_cls.stages import FILTER_METRIC
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics, sum_by_rank
from mindspeed_rl.data.driver_dock import group_rows


def kept_groups(metric: torch.Tensor, n_samples: int) -> torch.Tensor:
    """Group ids (rows n*g .. n*g+n-1) whose metric is not the same for every
    sample; with one sample per prompt every group is kept (as upstream)."""
    groups = metric.reshape(-1, n_samples)
    if n_samples == 1:
        return torch.arange(groups.shape[0])
    return torch.nonzero(groups.max(dim=1).values != groups.min(dim=1).values).reshape(-1)


class Kept:
    """The rows an iteration keeps, column by column, and its group counts."""

    def __init__(self):
        self.columns: Dict[str, list] = defaultdict(list)
        self.kept = self.dropped = self.train = 0


def step(trainer, iteration: int, batch: dict) -> Dict[str, float]:
    plan, td = trainer.run_plan, trainer.transfer_dock
    spec = plan.group_filter
    start = time.perf_counter()
    trainer.kept = kept = Kept()
    rollout_metrics, rollout_results, batches = [], [], 0
    while True:
        trainer.took_batch(iteration)
        batches += 1
        # rounds numbered from the data position, so a resumed run draws the same random splits
        td.set_round(2 * trainer.data_position - 2)
        td.start_round(trainer.checked(batch), trainer.dataset_additional_keys)
        # the rollout seed follows the batch, not the iteration: refills sample afresh
        metrics, results = trainer.run_stages(plan.phase_stages("rollout"), iteration=trainer.data_position)
        rollout_metrics.append(metrics)
        rollout_results += results
        if kept.train >= spec.train_prompts or 0 < spec.max_batches <= batches:
            break
        batch = next(trainer.data_iter)
    groups = kept.train
    rows = groups * plan.n_samples
    if rows < plan.min_train_rows:
        raise RuntimeError(
            f"iteration {iteration}: dynamic sampling kept {groups} groups ({rows} rows) in {batches} "
            f"rollout batches (rl_config.filter_groups_max_batches={spec.max_batches}); the train stages need "
            f"at least {plan.min_train_rows} rows to give every DP rank its shares: raise "
            f"filter_groups_max_batches or check that rewards vary within a group")
    if groups < spec.train_prompts:
        print(f"iter {iteration}: dynamic sampling stopped at filter_groups_max_batches={spec.max_batches}: "
              f"training on {groups} of {spec.train_prompts} groups", flush=True)
    # the kept rows become this iteration's train round
    td.set_round(2 * trainer.data_position - 1)
    td.clear()
    td.put_experience(dict(kept.columns), list(range(rows)))
    metrics, results = trainer.run_stages(plan.phase_stages("train"), iteration=iteration)
    metrics.update(merge_rollout_metrics(rollout_metrics))
    metrics.update({"dapo/rollout_batches": float(batches), "dapo/extra_rollout_batches": float(batches - 1),
                    "train/num_gen_batches": float(batches), "dapo/kept_groups": float(kept.kept),
                    "dapo/dropped_groups": float(kept.dropped), "dapo/train_groups": float(groups),
                    "dapo/batch_full": float(groups >= spec.train_prompts)})
    return trainer.finish_step(iteration, metrics, sum_by_rank(rollout_results) + results, start)


def filter_groups(trainer, stage) -> Dict[str, float]:
    """Keep this batch's groups whose filter metric varies, up to the train batch's size, with the columns
    the train stages read (into ``trainer.kept``)."""
    n, td, kept = trainer.run_plan.n_samples, trainer.transfer_dock, trainer.kept
    needed = trainer.run_plan.group_filter.train_prompts - kept.train
    metric = td.get_rows([FILTER_METRIC], list(range(stage.rows_per_share)))[FILTER_METRIC]
    keep = kept_groups(torch.cat([m.reshape(-1).float() for m in metric]), n)
    kept.kept += int(keep.numel())
    kept.dropped += stage.rows_per_share // n - int(keep.numel())
    keep = keep[:max(needed, 0)]
    if keep.numel():
        rows = group_rows(keep, n).tolist()
        carried = [c for c in stage.inputs if c != FILTER_METRIC]
        got = td.get_rows(carried, rows)
        for column in carried:
            kept.columns[column] += list(got[column])
        kept.train += int(keep.numel())
    return {}


def summary(m: Dict[str, float]) -> str:
    """The console line's dynamic-sampling part ('' when the iteration had none)."""
    if "dapo/kept_groups" not in m:
        return ""
    return (f" dapo: batches={int(m['dapo/rollout_batches'])} kept={int(m['dapo/kept_groups'])} "
            f"dropped={int(m['dapo/dropped_groups'])} trained={int(m['dapo/train_groups'])}")


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_stage("filter_groups")(filter_groups)
