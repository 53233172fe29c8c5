"""The driver's dock over a hand-built run plan: a round's DP plans (full, short and refused rounds), the
balance settings and seed the plan gives, dispatch and put_stage, and the round's life cycle."""
import numpy as np
import pytest
import torch

from mindspeed_rl.plan.run_plan import BalanceSpec, Layout, RunPlan, StagePlan
from mindspeed_rl.plan.stages import OLD, SEQ_COLUMNS, TRAIN
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.utils.metrics import Metric
from mindspeed_rl.balance.seqlen_balancing import get_seqlen_balanced_partitions
from mindspeed_rl.balance.workload import WorkloadModel

DP = 2


def _plan(balanced=True, seed=7, balance=None, rows_per_share=8, shares_per_rank=2):
    """Two DP stages of the actor: log-probs (writes old_log_prob) and train; dp 2, 2 shares a rank."""
    old = StagePlan(OLD.name, rows_per_share, shares_per_rank, balanced, stage=OLD, inputs=SEQ_COLUMNS)
    train = StagePlan(TRAIN.name, rows_per_share, shares_per_rank, balanced, stage=TRAIN, inputs=SEQ_COLUMNS)
    return RunPlan(Layout(DP, DP, 1), prompts_per_round=8, n_samples=4, mini_batch_rows=rows_per_share * DP,
                   epochs=1, train_iters=1, stages={OLD.name: old, TRAIN.name: train}, seed=seed, balance=balance)


def _fill(dock, prompts=None, seed=0):
    """Put ``prompts`` prompts (default: all) and a response for each of their rows; the rows' token counts."""
    prompts = dock.prompts_num if prompts is None else prompts
    rng = np.random.default_rng(seed)
    plen = rng.integers(2, 30, prompts)
    dock.put_prompts_experience({"prompts": [torch.ones(int(p), dtype=torch.long) for p in plen]})
    rows = prompts * dock.n_samples_per_prompt
    resp = np.maximum(1, rng.lognormal(4, 1.0, rows)).astype(int)
    dock.put_experience({"responses": [torch.ones(int(r), dtype=torch.long) for r in resp],
                         "response_length": torch.tensor(resp)}, list(range(rows)))
    return np.repeat(plen, dock.n_samples_per_prompt) + resp


def _rows(plan):
    return sorted(r for shares in plan for share in shares for r in share)


@pytest.mark.parametrize("prompts,sizes", [(5, [5, 5, 5, 5]), (3, [3, 3, 3, 3]), (1, [1, 1, 1, 1])])
def test_a_short_round_is_cut_into_the_planned_number_of_shares(prompts, sizes):
    """DAPO keeps fewer groups than planned: the stage still gets dp x shares_per_rank shares."""
    dock = DriverDock(8, 4, run_plan=_plan())
    _fill(dock, prompts)
    plan = dock.plan_stage(OLD.name)
    assert [len(shares) for shares in plan] == [2, 2]
    assert sorted(len(share) for shares in plan for share in shares) == sizes
    assert _rows(plan) == list(range(4 * prompts))


def test_a_short_round_of_uneven_rows_gives_shares_one_row_apart():
    dock = DriverDock(8, 1, run_plan=_plan(rows_per_share=2))
    _fill(dock, 6)
    plan = dock.plan_stage(OLD.name)
    assert sorted(len(share) for shares in plan for share in shares) == [1, 1, 2, 2]
    assert _rows(plan) == list(range(6))


def test_a_round_with_fewer_rows_than_shares_or_more_than_planned_is_refused():
    dock = DriverDock(8, 1, run_plan=_plan(rows_per_share=2))
    _fill(dock, 3)
    with pytest.raises(RuntimeError, match=r"^plan_stage\('actor_log_prob'\): the round holds 3 rows; the stage "
                                           r"takes at most 8, at least one per share of its 4 shares$"):
        dock.plan_stage(OLD.name)
    big = DriverDock(12, 1, run_plan=_plan(rows_per_share=2))
    _fill(big)
    with pytest.raises(RuntimeError, match=r"the round holds 12 rows; the stage takes at most 8,"):
        big.plan_stage(OLD.name)
    exact = DriverDock(8, 1, run_plan=_plan(rows_per_share=2))
    _fill(exact, 4)  # one row per share: the least a round can hold
    assert sorted(len(s) for shares in exact.plan_stage(OLD.name) for s in shares) == [1, 1, 1, 1]


def test_prompts_must_be_the_first_rows_of_the_round():
    dock = DriverDock(8, 1, run_plan=_plan(rows_per_share=2))
    _fill(dock, 4)
    # a prompt at row 4 right after the round's four: the round is not rows 0 .. n-1
    dock.put_experience({"prompts": [torch.ones(2, dtype=torch.long)]}, [5])
    with pytest.raises(RuntimeError, match=r"^transfer dock: the round's prompts are not rows 0 \.\. n-1$"):
        dock.plan_stage(OLD.name)
    gap = DriverDock(8, 1, run_plan=_plan(rows_per_share=2))
    _fill(gap, 4)
    gap.put_experience({"prompts": [torch.ones(2, dtype=torch.long)]}, [4])  # rows 0 .. 4: a round of 5
    with pytest.raises(RuntimeError, match="never put: 'responses' rows \\[4\\]"):
        gap.plan_stage(OLD.name)


def test_the_plan_balances_prompt_plus_response_tokens():
    dock = DriverDock(8, 4, run_plan=_plan())
    lengths = _fill(dock, seed=3)
    plan = dock.plan_stage(OLD.name)
    loads = sorted(int(lengths[share].sum()) for shares in plan for share in shares)
    best = get_seqlen_balanced_partitions(lengths.astype(float), 4, equal_size=True)
    assert loads == sorted(int(lengths[p].sum()) for p in best)
    record = dock.round_summary()["balance"][0]
    assert record["consumer"] == OLD.name and record["objective"] == "tokens" and record["balanced"]
    assert sorted(record["loads"]) == loads


def test_the_plans_balance_spec_sets_objective_and_method():
    model = WorkloadModel(1.0, 0.05)
    dock = DriverDock(8, 4, run_plan=_plan(balance=BalanceSpec("flops", "greedy", model)),
                      balance_objective="tokens", balance_method="auto")
    lengths = _fill(dock, seed=5)
    plan = dock.plan_stage(OLD.name)
    costs = model.cost(lengths)
    got = sorted(float(costs[share].sum()) for shares in plan for share in shares)
    greedy = get_seqlen_balanced_partitions(costs, 4, equal_size=True, method="greedy")
    assert got == pytest.approx(sorted(float(costs[p].sum()) for p in greedy))
    auto = get_seqlen_balanced_partitions(costs, 4, equal_size=True, method="auto")
    assert sorted(float(costs[p].sum()) for p in auto) != pytest.approx(got)  # the method shows in the plan
    record = dock.round_summary()["balance"][0]
    assert record["objective"] == "flops" and sorted(record["loads"]) == pytest.approx(got)


def test_the_plans_seed_draws_the_random_splits():
    def split(seed):
        dock = DriverDock(8, 4, run_plan=_plan(balanced=False, seed=seed), seed=seed + 1)
        _fill(dock)
        return dock.plan_stage(OLD.name)
    assert split(7) == split(7)
    assert split(7) != split(8)
    # the plan's seed wins over the keyword: the same plan seed with another keyword draws the same split
    a = DriverDock(8, 4, run_plan=_plan(balanced=False, seed=7), seed=1)
    _fill(a)
    assert a.plan_stage(OLD.name) == split(7)


def test_balance_metrics_go_to_the_metric_given():
    metrics = Metric()
    dock = DriverDock(8, 4, run_plan=_plan(), metrics=metrics)
    _fill(dock)
    dock.plan_stage(OLD.name)
    assert dock.metrics is metrics
    assert metrics.compute()["dp_balance/actor_log_prob/shares"] == 4


def test_dispatch_sends_each_rank_its_shares_rows_in_plan_order():
    dock = DriverDock(8, 4, run_plan=_plan())
    lengths = _fill(dock)
    group = StageGroup.of(dock.run_plan.stages[OLD.name])
    plan, *batches = dock.dispatch(group)
    assert plan == dock.plan_stage(OLD.name) and len(batches) == DP
    for shares, batch in zip(plan, batches):
        rows = [r for share in shares for r in share]
        assert set(batch) == set(SEQ_COLUMNS)
        assert [int(p) + int(r) for p, r in zip(batch["prompt_length"], batch["response_length"])] == \
            [int(lengths[r]) for r in rows]
        assert [t.numel() for t in batch["responses"]] == [int(batch["response_length"][i]) for i in range(len(rows))]


def test_put_stage_writes_each_ranks_values_at_its_rows():
    dock = DriverDock(8, 4, run_plan=_plan())
    _fill(dock)
    group = StageGroup.of(dock.run_plan.stages[OLD.name])
    plan, *_ = dock.dispatch(group)
    # each rank answers one value per row: the row number, as a float
    outputs = [{"old_log_prob": [torch.tensor([float(r)]) for share in shares for r in share]} for shares in plan]
    with pytest.raises(ValueError, match=r"^put_stage\('actor_log_prob'\): 1 outputs for 2 DP ranks$"):
        dock.put_stage(group, outputs[0])
    with pytest.raises(ValueError, match=r"^put_stage\('actor_log_prob'\): rank 0 gave columns \['ref_log_prob'\], "
                                         r"the stage writes \['old_log_prob'\]$"):
        dock.put_stage(group, {"ref_log_prob": outputs[0]["old_log_prob"]}, outputs[1])
    assert not bool(dock.experience_data_status["old_log_prob"].any())
    dock.put_stage(group, *outputs)
    got = dock.get_rows(["old_log_prob"], list(range(32)))["old_log_prob"]
    assert [float(t) for t in got] == [float(r) for r in range(32)]


def test_a_round_starts_empty_with_new_plans_and_metrics():
    dock = DriverDock(8, 4, run_plan=_plan(balanced=False))
    _fill(dock)
    first = dock.plan_stage(OLD.name)
    assert dock.plan_stage(OLD.name) is first  # one plan per round
    assert dock.round == 0
    summary = dock.round_summary()
    assert summary["metrics"]["dp_balance/actor_log_prob/shares"] == 4 and len(summary["balance"]) == 1
    assert dock.round_summary()["balance"] == []  # the records are handed out once
    dock.start_round({"prompts": [torch.ones(3, dtype=torch.long)] * 8})
    assert dock.round == 1
    assert dock.metrics.compute() == {}
    assert not bool(dock.experience_data_status["responses"].any())
    assert bool(dock.experience_data_status["prompts"].all())
    assert [int(t) for t in dock.get_rows(["prompt_length"], [0, 31])["prompt_length"]] == [3, 3]
    with pytest.raises(RuntimeError, match="never put: 'responses'"):  # last round's plan is gone
        dock.plan_stage(OLD.name)


def test_set_round_continues_the_count_and_forgets_the_plans():
    dock = DriverDock(8, 4, run_plan=_plan(balanced=False))
    _fill(dock)
    dock.plan_stage(OLD.name)
    dock.set_round(5)
    assert dock.round == 5
    assert dock.plan_stage(OLD.name) != []  # planned again for round 5 from the rows still there
    fresh = DriverDock(8, 4, run_plan=_plan(balanced=False))
    fresh.set_round(4)
    fresh.clear()  # round 5
    _fill(fresh)
    assert fresh.plan_stage(OLD.name) == dock.plan_stage(OLD.name)
