"""The dock plans each DP stage's round once; share s goes to DP rank s % dp."""
import numpy as np
import pytest
import torch

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.run_plan import Layout, RunPlan, StagePlan
from mindspeed_rl.plan.stages import TRAIN
from mindspeed_rl.data.driver_dock import DriverDock as Dock
from mindspeed_rl.balance.seqlen_balancing import get_seqlen_balanced_partitions

COLS = ["prompts", "responses", "prompt_length", "response_length"]


def _plan(dp=4, rows_per_share=8, shares_per_rank=2, balanced=True, prompts=16, n=4):
    stage = StagePlan(TRAIN.name, rows_per_share, shares_per_rank, balanced, stage=TRAIN, inputs=tuple(COLS))
    return RunPlan(Layout(dp, dp, 1), prompts_per_round=prompts, n_samples=n, mini_batch_rows=rows_per_share * dp,
                   epochs=1, train_iters=1, stages={TRAIN.name: stage}, seed=7)


def _fill(dock, seed=0):
    rng = np.random.default_rng(seed)
    plen = rng.integers(2, 30, dock.prompts_num)
    dock.put_prompts_experience({"prompts": [torch.ones(int(p), dtype=torch.long) for p in plen]})
    resp = np.maximum(1, rng.lognormal(4, 1.0, dock.max_len)).astype(int)
    rows = list(range(dock.max_len))
    dock.put_experience({"responses": [torch.ones(int(r), dtype=torch.long) for r in resp],
                         "response_length": [torch.tensor([int(r)]) for r in resp]}, rows)
    return np.repeat(plen, dock.n_samples_per_prompt) + resp


def test_plan_binds_share_s_to_rank_s_mod_dp_and_is_the_balanced_partition():
    dock = Dock(16, 4, run_plan=_plan())
    lengths = _fill(dock)
    plan = dock.plan_stage(TRAIN.name)
    assert len(plan) == 4 and all(len(shares) == 2 for shares in plan)
    assert dock.plan_stage(TRAIN.name) is plan  # planned once per round
    shares = get_seqlen_balanced_partitions(lengths.astype(float), 8, equal_size=True)
    assert sorted(lengths[s].sum() for s in shares) == sorted(lengths[r].sum() for p in plan for r in p)
    assert sorted(r for p in plan for rows in p for r in rows) == list(range(64))  # every row exactly once
    history = dock.round_summary()["balance"]
    assert history[-1]["ranks"] == [s % 4 for s in range(8)]
    loads = np.array(history[-1]["loads"])
    served = [lengths[plan[s % 4][s // 4]].sum() for s in range(8)]
    assert np.allclose(loads, served)  # the recorded load of share s is what rank s % dp was sent


def test_get_rows_returns_the_rows_in_the_order_asked():
    dock = Dock(16, 4, run_plan=_plan())
    lengths = _fill(dock)
    rows = [9, 2, 63, 0]
    batch = dock.get_rows(COLS, rows)
    got = [int(p) + int(r) for p, r in zip(batch["prompt_length"], batch["response_length"])]
    assert got == [int(lengths[r]) for r in rows]
    assert [int(r.numel()) for r in batch["responses"]] == [int(batch["response_length"][i]) for i in range(4)]


def test_missing_data_is_an_error_naming_column_and_rows_not_a_wait():
    dock = Dock(16, 4, run_plan=_plan())
    dock.put_prompts_experience({"prompts": [torch.ones(3, dtype=torch.long)] * 16})
    with pytest.raises(RuntimeError, match=r"stage 'actor_train' needs data that was never put: 'responses' rows"):
        dock.plan_stage(TRAIN.name)
    with pytest.raises(RuntimeError, match="'response_length' rows \\[5\\]"):
        dock.get_rows(["response_length"], [5])
    assert TRAIN.name not in dock._stage_plans  # nothing half-planned


def test_unknown_stage_or_no_run_plan_is_an_error():
    dock = Dock(16, 4, run_plan=_plan())
    _fill(dock)
    with pytest.raises(ValueError, match="no DP stage 'ref_log_prob'"):
        dock.plan_stage("ref_log_prob")
    with pytest.raises(ValueError, match="run_plan"):
        Dock(16, 4).plan_stage(TRAIN.name)


def test_random_split_when_unbalanced_is_seeded_per_round_and_logged():
    plan = _plan(balanced=False)
    rounds = []
    dock = Dock(16, 4, run_plan=plan)
    for _ in range(2):
        dock.clear()
        _fill(dock)
        rounds.append(dock.plan_stage(TRAIN.name))
        metrics = dock.metrics.compute()
        assert metrics["dp_balance/actor_train/imbalance"] > 0
    again = Dock(16, 4, run_plan=plan)
    again.clear()
    _fill(again)
    assert again.plan_stage(TRAIN.name) == rounds[0]  # same seed, same round: same split
    assert rounds[0] != rounds[1]  # a new round draws a new split


def test_resumed_dock_draws_the_uninterrupted_runs_split_of_each_round():
    """The trainer calls set_round(k) on a run resumed after iteration k, then
    clear() before each iteration: round k + 1's random split (rollout, or any
    unbalanced stage) is the one the uninterrupted run drew."""
    plan = _plan(balanced=False)
    straight = Dock(16, 4, run_plan=plan)
    straight.set_round(0)
    splits = []
    for _ in range(4):
        straight.clear()
        _fill(straight)
        splits.append(straight.plan_stage(TRAIN.name))
    assert len({str(s) for s in splits}) == 4  # every round draws its own split
    resumed = Dock(16, 4, run_plan=plan)
    resumed.set_round(2)
    for k in (2, 3):
        resumed.clear()
        _fill(resumed)
        assert resumed.plan_stage(TRAIN.name) == splits[k], f"round {k + 1}"


def test_the_dock_holds_the_columns_its_stages_read_and_write():
    plan = build_configs(load_config("configs/grpo_tiny_cpu.yaml",
                                     ["megatron_training.model_path=/unused"])).plan
    dock = Dock(plan.prompts_per_round, plan.n_samples, addition_columns=["labels"], run_plan=plan)
    written = {c for s in plan.stages.values() for c in s.outputs}
    read = {c for s in plan.stages.values() for c in s.inputs}
    assert set(dock.experience_columns) == {"prompts", "prompt_length", "labels"} | written | read
    with pytest.raises(ValueError, match=r"unknown columns \['returns'\]"):  # no GRPO stage writes returns
        dock.put_experience({"returns": [torch.zeros(1)]}, [0])


def test_tiny_config_plan_drives_the_dock():
    plan = build_configs(load_config("configs/grpo_tiny_cpu.yaml",
                                     ["megatron_training.model_path=/unused"])).plan
    dock = Dock(plan.prompts_per_round, plan.n_samples, run_plan=plan)
    _fill(dock)
    rows = list(range(dock.max_len))
    dock.put_experience({c: [torch.zeros(1)] * len(rows) for c in ("advantages", "old_log_prob", "ref_log_prob")},
                        rows)
    assert [s.name for s in plan.dp_stages if s.queued] == ["actor_rollout"]  # served from the queue: no plan
    for stage in (s for s in plan.dp_stages if not s.queued):
        shares = dock.plan_stage(stage.name)
        sizes = [len(rows) for per_rank in shares for rows in per_rank]
        assert len(shares) == plan.layout.dp
        assert sizes == [stage.rows_per_share] * (stage.shares_per_rank * plan.layout.dp), stage.name
