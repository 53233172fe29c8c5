"""DAPO's dynamic sampling (rl_config.filter_groups_enable), under any megatron_training.stage.

A row part of the trainer modes (trainer/modes): an iteration runs the run plan's 'rollout' stages once per round of
rows (a fresh prompt batch, or with partial rollout a take of complete groups from its pool): rollout, rewards,
advantages, then the filter stage, which drops the groups whose filter metric is the same for every sample and keeps
the rest on the driver. Batches are added until ``filter_groups_train_batch_size`` groups are kept (the surplus of
the last batch is dropped) or ``filter_groups_max_batches`` batches ran (then the kept groups are trained on, and
the shortfall is logged). The kept rows become a round of their own and the 'train' stages run on it: every DP rank
gets a balanced share of whatever row count is left (sizes differ by at most one row).
"""
from collections import defaultdict
from typing import Dict

import torch

from mindspeed_rl.algorithms import register_stage
from mindspeed_rl.plan.stages import FILTER_METRIC, ROLLOUT
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


def fill(trainer, rounds, iteration: int) -> Dict[str, float]:
    """Draw rounds (trainer/modes/rounds.py: fresh batches, or partial rollout's pool) and run the rollout-phase
    stages after the rollout on each (rewards, advantages, the filter) until the train batch is full or
    ``filter_groups_max_batches`` rounds ran; the kept rows become the dock's train round. Returns the
    dynamic-sampling metrics."""
    plan, td = trainer.run_plan, trainer.transfer_dock
    spec = plan.group_filter
    trainer.kept = kept = Kept()
    after = [s for s in plan.phase_stages("rollout") if s.name != ROLLOUT.name]
    batches = 0
    while True:
        rounds.next_round()
        batches += 1
        metrics, results = trainer.run_stages(after, iteration=rounds.seed_iteration)
        rounds.record(metrics, results)
        if kept.train >= spec.train_prompts or 0 < spec.max_batches <= batches:
            break
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
    td.set_round(rounds.train_round)
    td.clear()
    td.put_experience(dict(kept.columns), list(range(rows)))
    return {"dapo/rollout_batches": float(batches), "dapo/extra_rollout_batches": float(batches - 1),
            "train/num_gen_batches": float(batches), "dapo/kept_groups": float(kept.kept),
            "dapo/dropped_groups": float(kept.dropped), "dapo/train_groups": float(groups),
            "dapo/batch_full": float(groups >= spec.train_prompts)}


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
