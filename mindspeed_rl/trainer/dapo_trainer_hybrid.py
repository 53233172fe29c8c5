"""RayDAPOTrainer: DAPO on the GRPO loop (upstream's ``stage: ray_dapo``).

The loss switches (token_level_loss, clip_higher_enable) act in the worker's
loss and the overlong penalty in the rewards stage, as for GRPO. With dynamic
sampling (``filter_groups_enable``) an iteration runs the run plan's 'rollout'
stages once per prompt batch: rollout, rewards, then the filter stage, which
drops the groups whose filter metric is the same for every sample and keeps
the rest on the driver. Batches are added until ``filter_groups_train_batch_size``
groups are kept (the surplus of the last batch is dropped) or
``filter_groups_max_batches`` batches ran (then the kept groups are trained on,
and the shortfall is logged). The kept rows become a round of their own and the
'train' stages run on it: every DP rank gets a balanced share of whatever row
count is left (sizes differ by at most one row), with the same number of shares.
"""
import time
from collections import defaultdict
from typing import Dict

import torch

from mindspeed_rl.config_cls.stages import FILTER_METRIC
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics, sum_by_rank  # noqa: F401  (their home)
from mindspeed_rl.trainer.utils.transfer_dock import group_rows


def kept_groups(metric: torch.Tensor, n_samples: int) -> torch.Tensor:
    """Group ids (rows n*g .. n*g+n-1) whose metric is not the same for every
    sample; with one sample per prompt every group is kept (as upstream)."""
    groups = metric.reshape(-1, n_samples)
    if n_samples == 1:
        return torch.arange(groups.shape[0])
    return torch.nonzero(groups.max(dim=1).values != groups.min(dim=1).values).reshape(-1)


class RayDAPOTrainer(RayGRPOTrainer):
    """Upstream's RayDAPOTrainer name; takes RayGRPOTrainer's arguments."""

    def step(self, iteration: int, batch: dict) -> Dict[str, float]:
        plan = self.run_plan
        spec = plan.group_filter
        if spec is None:
            return super().step(iteration, batch)
        start = time.perf_counter()
        td = self.transfer_dock
        self._kept: Dict[str, list] = defaultdict(list)
        self._counts = {"kept": 0, "dropped": 0, "train": 0}
        rollout_metrics, rollout_results, batches = [], [], 0
        while True:
            self._took_batch(iteration)
            batches += 1
            # rounds numbered from the data position, so a resumed run draws the same random splits
            td.set_round(2 * self.data_position - 2)
            td.start_round(self._checked(batch), self.dataset_additional_keys)
            # the rollout seed follows the batch, not the iteration: refills sample afresh
            metrics, results = self._run_stages(plan.phase_stages("rollout"), iteration=self.data_position)
            rollout_metrics.append(metrics)
            rollout_results += results
            if self._counts["train"] >= spec.train_prompts:
                break
            if 0 < spec.max_batches <= batches:
                break
            batch = next(self._data)
        groups = self._counts["train"]
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
        td.set_round(2 * self.data_position - 1)
        td.clear()
        td.put_experience(dict(self._kept), list(range(rows)))
        metrics, results = self._run_stages(plan.phase_stages("train"), iteration=iteration)
        metrics.update(merge_rollout_metrics(rollout_metrics))
        metrics.update({"dapo/rollout_batches": float(batches), "dapo/extra_rollout_batches": float(batches - 1),
                        "train/num_gen_batches": float(batches),
                        "dapo/kept_groups": float(self._counts["kept"]),
                        "dapo/dropped_groups": float(self._counts["dropped"]),
                        "dapo/train_groups": float(groups),
                        "dapo/batch_full": float(groups >= spec.train_prompts)})
        return self._finish_step(iteration, metrics, sum_by_rank(rollout_results) + results, start)

    def filter_groups(self, stage) -> Dict[str, float]:
        """Driver stage (dynamic sampling): keep this batch's groups whose filter
        metric varies, up to the train batch's size, with the columns the train stages read."""
        n, td = self.run_plan.n_samples, self.transfer_dock
        needed = self.run_plan.group_filter.train_prompts - self._counts["train"]
        metric = td.get_rows([FILTER_METRIC], list(range(stage.rows_per_share)))[FILTER_METRIC]
        keep = kept_groups(torch.cat([m.reshape(-1).float() for m in metric]), n)
        self._counts["kept"] += int(keep.numel())
        self._counts["dropped"] += stage.rows_per_share // n - int(keep.numel())
        keep = keep[:max(needed, 0)]
        if keep.numel():
            rows = group_rows(keep, n).tolist()
            carried = [c for c in stage.inputs if c != FILTER_METRIC]
            got = td.get_rows(carried, rows)
            for column in carried:
                self._kept[column] += list(got[column])
            self._counts["train"] += int(keep.numel())
        return {}

    @staticmethod
    def _summary(iteration: int, m: Dict[str, float]) -> str:
        line = RayGRPOTrainer._summary(iteration, m)
        if "dapo/kept_groups" not in m:
            return line
        return (line + f" dapo: batches={int(m['dapo/rollout_batches'])} kept={int(m['dapo/kept_groups'])} "
                f"dropped={int(m['dapo/dropped_groups'])} trained={int(m['dapo/train_groups'])}")
