"""BalancePlanner on its own: how a pool of units is cut into shares (balanced, seeded random, exact or
not, a given number of shares), first-come-first-served serving, and what each plan records."""
import numpy as np
import pytest
import torch

from mindspeed_rl.balance.balance_plan import BalancePlanner
from mindspeed_rl.utils.metrics import Metric
from mindspeed_rl.balance.seqlen_balancing import get_seqlen_balanced_partitions
from mindspeed_rl.balance.workload import WorkloadModel

# token counts of 12 units of two rows each (a unit: a GRPO group of n = 2)
LENGTHS = torch.tensor([[50, 3], [7, 7], [90, 1], [2, 2], [30, 31], [5, 60], [8, 1], [40, 40], [3, 4], [12, 11],
                        [70, 9], [1, 1]])


def lengths_of(units):
    return LENGTHS[units]


def _units(shares):
    return [u.tolist() for u in shares]


def _loads(shares):
    return sorted(int(LENGTHS[u].sum()) for u in shares)


@pytest.mark.parametrize("kwargs,match", [
    ({"objective": "speed"}, r"^balance objective must be one of \('tokens', 'flops'\), got 'speed'$"),
    ({"objective": "flops"}, r"^balance objective 'flops' needs a workload_model \(model dimensions\)$"),
    ({"method": "best"}, r"^balance method must be one of \('auto', 'heapq', 'karmarkar_karp', 'greedy'\), "
                         r"got 'best'$"),
])
def test_bad_settings_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BalancePlanner(**kwargs)


def test_a_balanced_plan_is_the_balanced_partition_of_the_unit_costs():
    planner = BalancePlanner()
    shares = planner.make_plan("ref", torch.arange(12), 3, lengths_of)
    assert [len(s) for s in shares] == [3, 3, 3, 3]
    assert sorted(u for s in _units(shares) for u in s) == list(range(12))
    costs = LENGTHS.sum(1).double().numpy()
    best = get_seqlen_balanced_partitions(costs, 4, equal_size=True)
    assert _loads(shares) == sorted(int(costs[p].sum()) for p in best)


def test_the_plan_keeps_the_callers_unit_ids():
    planner = BalancePlanner()
    usable = torch.tensor([11, 4, 7, 0])
    shares = planner.make_plan("ref", usable, 2, lengths_of)
    assert sorted(u for s in _units(shares) for u in s) == [0, 4, 7, 11]
    # the loads are those of the ids given, not of positions 0 .. 3
    assert sorted(planner.history[-1]["loads"]) == _loads(shares)


def test_flops_costs_come_from_the_workload_model():
    model = WorkloadModel(1.0, 0.5)
    planner = BalancePlanner(objective="flops", workload_model=model)
    costs = planner.unit_costs(torch.tensor([[2, 4], [10, 0]], dtype=torch.int32))
    assert costs.tolist() == pytest.approx([(2 + 2) + (4 + 8), 10 + 50])
    tokens = BalancePlanner().unit_costs(torch.tensor([[2, 4], [10, 0]], dtype=torch.int32))
    assert tokens.dtype == np.float64 and tokens.tolist() == [6.0, 10.0]


def test_shares_of_at_most_needed_units_or_exactly_needed():
    planner = BalancePlanner()
    loose = planner.make_plan("c", torch.arange(10), 4, lengths_of)  # ceil(10 / 4) = 3 shares, sizes 4 3 3
    assert sorted(len(s) for s in loose) == [3, 3, 4]
    assert sorted(u for s in _units(loose) for u in s) == list(range(10))
    exact = planner.make_plan("c", torch.arange(10), 4, lengths_of, exact=True)  # 2 shares of 4, units 8, 9 left
    assert [len(s) for s in exact] == [4, 4]
    assert sorted(u for s in _units(exact) for u in s) == list(range(8))
    # the planner's default: exact_shares
    assert [len(s) for s in BalancePlanner(exact_shares=True).make_plan("c", torch.arange(10), 4, lengths_of)] == [4, 4]
    assert BalancePlanner(exact_shares=True).make_plan("c", torch.arange(3), 4, lengths_of) == []
    assert [len(s) for s in BalancePlanner(exact_shares=True).make_plan("c", torch.arange(4), 4, lengths_of)] == [4]


def test_nothing_to_plan_gives_no_shares_and_no_record():
    planner = BalancePlanner()
    assert planner.make_plan("c", torch.arange(0), 2, lengths_of) == []
    assert planner.make_plan("c", torch.arange(4), 0, lengths_of) == []
    assert planner.make_plan("c", torch.arange(4), -1, lengths_of) == []
    assert planner.pop_history() == []


def test_a_given_number_of_shares_sizes_one_apart():
    planner = BalancePlanner()
    shares = planner.make_plan("c", torch.arange(10), 99, lengths_of, n_shares=4, exact=True)  # exact ignored
    assert sorted(len(s) for s in shares) == [2, 2, 3, 3]
    assert sorted(u for s in _units(shares) for u in s) == list(range(10))
    every = planner.make_plan("c", torch.arange(3), 1, lengths_of, n_shares=3)
    assert sorted(len(s) for s in every) == [1, 1, 1]
    for n in (0, 4, -1):
        with pytest.raises(ValueError, match=rf"^make_plan\('c'\): 3 units cannot fill {n} shares$"):
            planner.make_plan("c", torch.arange(3), 1, lengths_of, n_shares=n)


def test_one_share_is_the_pool_in_its_order():
    planner = BalancePlanner()
    usable = torch.tensor([5, 1, 9])
    (share,) = planner.make_plan("c", usable, 3, lengths_of)
    assert share.tolist() == [5, 1, 9]
    (share,) = planner.make_plan("c", usable, 3, lengths_of, balanced=False)
    assert share.tolist() == [5, 1, 9]
    assert planner.history[-1]["sizes"] == [3]


def test_a_random_plan_is_an_equal_size_split_seeded_by_seed_and_round():
    def split(seed, round_index):
        planner = BalancePlanner(seed=seed)
        planner.reset(round_index)
        return _units(planner.make_plan("c", torch.arange(12), 3, lengths_of, balanced=False))
    first = split(1, 0)
    assert sorted(len(s) for s in first) == [3, 3, 3, 3]
    assert sorted(u for s in first for u in s) == list(range(12))
    assert split(1, 0) == first
    assert split(1, 1) != first and split(2, 0) != first
    assert first != [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]  # shuffled, not cut in order
    # a new planner starts at round 0
    assert _units(BalancePlanner(seed=1).make_plan("c", torch.arange(12), 3, lengths_of, balanced=False)) == first


def test_each_plan_is_recorded_with_loads_next_to_a_random_split_and_popped_once():
    planner = BalancePlanner(seed=3)
    metrics = Metric()
    shares = planner.make_plan("actor_train", torch.arange(12), 4, lengths_of, metrics=metrics)
    planner.make_plan("ref", torch.arange(6), 3, lengths_of, balanced=False)
    history = planner.pop_history()
    assert planner.pop_history() == [] and planner.history == []
    first, second = history
    assert first["consumer"] == "actor_train" and first["objective"] == "tokens" and first["balanced"] is True
    assert second["consumer"] == "ref" and second["balanced"] is False
    assert first["sizes"] == [len(s) for s in shares] == [4, 4, 4]
    assert first["loads"] == [float(LENGTHS[s].sum()) for s in shares]  # in share order
    # the random split of the same pool: same sizes, every unit once, so the same total
    assert len(first["random_loads"]) == 3 and sum(first["random_loads"]) == pytest.approx(float(LENGTHS.sum()))
    assert first["random_loads"] != first["loads"]
    loads = np.array(first["loads"])
    got = metrics.compute()
    assert got["dp_balance/actor_train/max_load"] == loads.max()
    assert got["dp_balance/actor_train/min_load"] == loads.min()
    assert got["dp_balance/actor_train/mean_load"] == pytest.approx(float(LENGTHS.sum()) / 3)
    assert got["dp_balance/actor_train/shares"] == 3
    assert got["dp_balance/actor_train/imbalance"] == pytest.approx(loads.max() / loads.mean() - 1)
    rnd = np.array(first["random_loads"])
    assert got["dp_balance/actor_train/imbalance_random"] == pytest.approx(rnd.max() / rnd.mean() - 1)
    assert not any(k.startswith("dp_balance/ref/") for k in got)  # no metrics given for 'ref'


def test_metrics_of_two_plans_of_one_consumer_are_cumulated():
    planner = BalancePlanner()
    metrics = Metric()
    planner.make_plan("c", torch.arange(4), 2, lengths_of, metrics=metrics)
    planner.make_plan("c", torch.arange(4, 10), 2, lengths_of, metrics=metrics)
    assert metrics.metric["dp_balance/c/shares"] == [2.0, 3.0]


def test_next_share_serves_a_plans_shares_in_turn_then_plans_again():
    planner = BalancePlanner()
    usable = torch.arange(8)
    first = planner.next_share("c", usable, 4, lengths_of)
    assert len(first) == 4
    second = planner.next_share("c", usable, 4, lengths_of)
    assert sorted(first.tolist() + second.tolist()) == list(range(8))  # the plan's other share
    assert len(planner.pop_history()) == 1  # one plan served both
    third = planner.next_share("c", usable, 4, lengths_of)  # used up: a new plan
    assert len(third) == 4 and len(planner.pop_history()) == 1


def test_next_share_plans_again_for_another_shape_a_used_share_or_after_drop():
    planner = BalancePlanner()
    planner.next_share("c", torch.arange(8), 2, lengths_of)
    planner.pop_history()
    planner.next_share("c", torch.arange(8), 2, lengths_of, unit=2)  # another unit: another shape
    assert len(planner.pop_history()) == 1
    planner.next_share("c", torch.arange(8), 4, lengths_of, unit=2)  # another count
    assert len(planner.pop_history()) == 1
    left = planner.next_share("c", torch.arange(8), 4, lengths_of, unit=2)  # same shape: served from the plan
    assert planner.pop_history() == [] and len(left) == 4
    first = planner.next_share("c", torch.arange(8), 2, lengths_of)
    planner.pop_history()
    rest = torch.tensor(sorted(set(range(8)) - set(first.tolist()) - {0, 1, 2}))
    # the rows a share of the plan holds are gone: that share is not served, a new plan is made
    share = planner.next_share("c", rest, 2, lengths_of)
    assert set(share.tolist()) <= set(rest.tolist()) and len(planner.pop_history()) == 1
    planner.next_share("c", torch.arange(8), 2, lengths_of)
    planner.pop_history()
    planner.drop("c")
    planner.drop("never planned")  # dropping an unknown consumer is fine
    planner.next_share("c", torch.arange(8), 2, lengths_of)
    assert len(planner.pop_history()) == 1


def test_next_share_serves_a_short_pool_whole_and_nothing_from_an_empty_one():
    planner = BalancePlanner()
    short = planner.next_share("c", torch.tensor([3, 6, 9]), 4, lengths_of)
    assert sorted(short.tolist()) == [3, 6, 9]
    exact = planner.next_share("c", torch.arange(5), 4, lengths_of)  # 5 >= 4: exactly 4, the fifth waits
    assert len(exact) == 4
    assert planner.next_share("c", torch.arange(0), 4, lengths_of) is None
    assert planner.next_share("c", torch.arange(4), 0, lengths_of) is None


def test_reset_forgets_the_plans():
    planner = BalancePlanner()
    planner.next_share("c", torch.arange(8), 4, lengths_of)
    planner.pop_history()
    planner.reset(1)
    planner.next_share("c", torch.arange(8), 4, lengths_of)
    assert len(planner.pop_history()) == 1


def test_one_unit_per_share_and_a_single_given_share():
    planner = BalancePlanner()
    assert sorted(_units(planner.make_plan("c", torch.arange(3), 1, lengths_of))) == [[0], [1], [2]]
    (whole,) = planner.make_plan("c", torch.tensor([4, 2, 8]), 1, lengths_of, n_shares=1)
    assert whole.tolist() == [4, 2, 8]


def test_a_given_number_of_shares_takes_every_unit_whatever_needed_says():
    shares = BalancePlanner().make_plan("c", torch.arange(10), 1, lengths_of, n_shares=4)
    assert sorted(u for s in _units(shares) for u in s) == list(range(10))


def test_the_method_chosen_is_the_one_that_splits():
    costs = LENGTHS.sum(1).double().numpy()
    greedy = get_seqlen_balanced_partitions(costs, 4, equal_size=True, method="greedy")
    auto = get_seqlen_balanced_partitions(costs, 4, equal_size=True, method="auto")
    shares = BalancePlanner(method="greedy").make_plan("c", torch.arange(12), 3, lengths_of)
    assert _loads(shares) == sorted(int(costs[p].sum()) for p in greedy)
    assert _loads(shares) != sorted(int(costs[p].sum()) for p in auto)  # the two methods differ here


def test_reset_without_a_round_is_round_0():
    planner = BalancePlanner(seed=4)
    first = _units(planner.make_plan("c", torch.arange(12), 3, lengths_of, balanced=False))
    planner.reset(3)
    planner.reset()
    assert _units(planner.make_plan("c", torch.arange(12), 3, lengths_of, balanced=False)) == first


def test_next_share_default_unit_is_one():
    planner = BalancePlanner()
    planner.next_share("c", torch.arange(8), 2, lengths_of)
    planner.pop_history()
    planner.next_share("c", torch.arange(8), 2, lengths_of, unit=1)  # the same shape: served from the plan
    assert planner.pop_history() == []


def test_a_plan_whose_share_is_gone_is_dropped_even_when_nothing_can_be_planned():
    planner = BalancePlanner()
    planner.next_share("c", torch.arange(8), 2, lengths_of)
    assert planner.next_share("c", torch.arange(0), 2, lengths_of) is None  # its next share is not usable
    planner.pop_history()
    planner.next_share("c", torch.arange(8), 2, lengths_of)  # the old plan is gone: planned afresh
    assert len(planner.pop_history()) == 1
