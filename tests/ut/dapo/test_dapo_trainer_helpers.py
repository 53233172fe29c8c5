"""DAPO driver helpers without a trainer: the group filter, merging rollout-batch metrics,
per-rank sums over the batches, and the summary line."""
import torch

from mindspeed_rl.trainer.dapo_trainer_hybrid import RayDAPOTrainer, kept_groups
from mindspeed_rl.trainer.utils.batch_metrics import (merge_rollout_metrics,
                                                      sum_by_rank)


def test_kept_groups_are_the_varying_groups_in_order():
    # 4 groups of 2: equal, varying, varying, equal
    metric = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 2.0, 3.0, 3.0])
    assert kept_groups(metric, 2).tolist() == [1, 2]
    # one sample per prompt: every group kept, even equal ones
    assert kept_groups(torch.tensor([5.0, 5.0, 5.0]), 1).tolist() == [0, 1, 2]
    # nothing varies: no group
    assert kept_groups(torch.ones(6), 3).tolist() == []


def test_merge_takes_max_min_and_mean_per_key_over_the_batches_that_have_it():
    merged = merge_rollout_metrics([{"a/max": 1.0, "a/min": 4.0, "a/mean": 1.0},
                                    {"a/max": 3.0, "a/min": 2.0, "a/mean": 2.0, "only/mean": 7.0},
                                    {"a/max": 2.0, "a/min": 3.0, "a/mean": 6.0}])
    # a key one batch has is that batch's value, not divided by the batch count
    assert merged == {"a/max": 3.0, "a/min": 2.0, "a/mean": 3.0, "only/mean": 7.0}
    assert merge_rollout_metrics([]) == {}


def test_sum_by_rank_adds_times_tokens_and_loads_and_keeps_the_last_other_value():
    results = [{"rank": 0, "timing/gen": 1.0, "tokens/gen": 10.0, "load/gen": 2.0, "reward/mean": 0.5},
               {"rank": 1, "timing/gen": 2.0, "tokens/gen": 20.0, "load/gen": 3.0, "reward/mean": 0.1},
               {"rank": 0, "timing/gen": 4.0, "tokens/gen": 5.0, "load/gen": 1.0, "reward/mean": 0.7}]
    got = sum_by_rank(results)
    # one dict per rank, in the order ranks first appear; the rank itself is not summed
    assert got == [{"rank": 0, "timing/gen": 5.0, "tokens/gen": 15.0, "load/gen": 3.0, "reward/mean": 0.7},
                   {"rank": 1, "timing/gen": 2.0, "tokens/gen": 20.0, "load/gen": 3.0, "reward/mean": 0.1}]
    # the input dicts are left as they were
    assert results[0]["timing/gen"] == 1.0 and results[2]["tokens/gen"] == 5.0


def test_summary_line_names_the_dapo_counts_only_when_dynamic_sampling_ran():
    m = {"reward/mean": 0.25}
    plain = RayDAPOTrainer._summary(3, m)
    assert plain.startswith("iter 3: reward=0.250") and "dapo" not in plain
    m.update({"dapo/rollout_batches": 2.0, "dapo/kept_groups": 7.0, "dapo/dropped_groups": 9.0,
              "dapo/train_groups": 6.0})
    line = RayDAPOTrainer._summary(3, m)
    assert line.startswith(plain)
    assert line.endswith(" dapo: batches=2 kept=7 dropped=9 trained=6")
