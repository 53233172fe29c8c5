"""Metric's edges: arrays of one value, empty ones named, entries without a value skipped (not ending the
rest), a bad list entry named by its key, no key refused; the balance figures per DP rank (TP peers and
rows without the stage left out, shares summed per bound rank)."""
import numpy as np
import pytest
import torch

from mindspeed_rl.utils.metrics import Metric, plan_balance_metrics, plan_loads, rank_balance_metrics


def test_arrays_and_tensors_of_one_value_are_that_value_and_empty_ones_are_named():
    m = Metric()
    m.update("one", np.array([2.5]))
    m.update("half", np.array([1, 2], dtype=np.float16))
    m.update("cum", torch.tensor(3.0), cumulate=True)
    m.update("cum", torch.tensor([5.0]), cumulate=True)
    assert m.compute() == {"one": 2.5, "half": 1.5, "cum": 4.0}
    assert m.metric["cum"] == [3.0, 5.0]
    m.update("empty", np.array([]))
    with pytest.raises(ValueError, match="^metric 'empty' holds an empty array$"):
        m.compute()


def test_entries_without_a_value_are_skipped_and_the_rest_computed():
    m = Metric()
    m.metric = {"none": None, "a": 1.0, "empty": [], "b": [2.0, 4.0]}
    assert m.compute() == {"a": 1.0, "b": 3.0}
    m.metric = {"bad": [1.0, "x"]}
    with pytest.raises(TypeError, match="^metric 'bad' holds a non-numeric value of type str$"):
        m.compute()
    with pytest.raises(ValueError, match="metric key must be a non-empty str, got ''"):
        Metric().update(value=3.0)


def test_rank_loads_come_from_each_dp_ranks_tp_source():
    results = [{"dp_rank": 0, "tp_rank": 0, "load/actor_train": 5.0},
               {"dp_rank": 0, "tp_rank": 1, "load/actor_train": 99.0},
               {"dp_rank": 1, "tp_rank": 0, "load/actor_train": 3.0},
               {"dp_rank": 2, "tp_rank": 0}]  # a rank that reported nothing for the stage
    out = rank_balance_metrics(results)
    assert out == {"dp_balance/actor_train/rank0": 5.0, "dp_balance/actor_train/rank1": 3.0,
                   "dp_balance/actor_train/rank_imbalance": pytest.approx(5.0 / 4.0 - 1)}


def test_plan_loads_are_summed_per_bound_rank_else_per_share():
    plan = {"consumer": "c", "loads": [1, 2, 3, 4], "random_loads": [4, 0, 0, 4], "ranks": [0, 1, 0, 1]}
    assert plan_loads(plan, "loads") == [4.0, 6.0]
    assert plan_loads(dict(plan, ranks=None), "loads") == [1.0, 2.0, 3.0, 4.0]
    assert plan_balance_metrics([plan]) == {"dp_balance/c/rank_imbalance_random": pytest.approx(0.0)}
    assert plan_balance_metrics([dict(plan, ranks=None)]) == {"dp_balance/c/rank_imbalance_random":
                                                                 pytest.approx(4 / 2 - 1)}
