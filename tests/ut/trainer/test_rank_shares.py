"""The dock serves each stage's shares by DP rank, from the run plan."""
import numpy as np
import pytest
import torch

from mindspeed_rl.config_cls import build_configs, load_config
from mindspeed_rl.config_cls.run_plan import Layout, RunPlan, StagePlan
from mindspeed_rl.trainer.utils.transfer_dock import GRPOTransferDock
from mindspeed_rl.utils.seqlen_balancing import get_seqlen_balanced_partitions

Dock = GRPOTransferDock.__ray_actor_class__
COLS = ["prompts", "responses", "prompt_length", "response_length"]


def _plan(dp=4, rows_per_share=8, shares_per_rank=2, balanced=True, prompts=16, n=4):
    stage = StagePlan("actor_train", rows_per_share, shares_per_rank, balanced)
    return RunPlan(Layout(dp, dp, 1), prompts_per_round=prompts, n_samples=n, mini_batch_rows=rows_per_share * dp,
                   epochs=1, train_iters=1, stages={"actor_train": stage}, seed=7)


def _fill(dock, seed=0):
    rng = np.random.default_rng(seed)
    prompts = dock.prompts_num
    plen = rng.integers(2, 30, prompts)
    dock.put_prompts_experience({"prompts": [torch.ones(int(p), dtype=torch.long) for p in plen]})
    resp = np.maximum(1, rng.lognormal(4, 1.0, dock.max_len)).astype(int)
    rows = list(range(dock.max_len))
    dock.put_experience({"responses": [torch.ones(int(r), dtype=torch.long) for r in resp],
                         "response_length": [torch.tensor([int(r)]) for r in resp]}, rows)
    return np.repeat(plen, dock.n_samples_per_prompt) + resp


def _take_all(dock, order):
    got = {r: [] for r in set(order)}
    for rank in order:
        batch, rows, done = dock.get_rank_share("actor_train", COLS, rank)
        assert not done and len(batch["responses"]) == len(rows)
        got[rank].append(rows)
    return got


def test_share_s_goes_to_rank_s_mod_dp_whatever_the_request_order():
    plan = _plan()
    a, b = Dock(16, 4, run_plan=plan), Dock(16, 4, run_plan=plan)
    lengths = _fill(a)
    _fill(b)
    first = _take_all(a, [0, 1, 2, 3, 0, 1, 2, 3])
    second = _take_all(b, [3, 3, 1, 0, 2, 1, 0, 2])
    assert first == second  # timing does not decide who gets what
    shares = get_seqlen_balanced_partitions(lengths.astype(float), 8, equal_size=True)
    loads = sorted(lengths[s].sum() for s in shares)
    served = sorted(lengths[rows].sum() for rank in first for rows in first[rank])
    assert served == loads  # the plan is the offline balanced partition
    assert sorted(r for rank in first for rows in first[rank] for r in rows) == list(range(64))
    assert dock_done(a, 0) and dock_done(a, 3)


def dock_done(dock, rank):
    return dock.get_rank_share("actor_train", COLS, rank) == (None, None, True)


def test_waits_until_the_whole_round_is_ready():
    dock = Dock(16, 4, run_plan=_plan())
    dock.put_prompts_experience({"prompts": [torch.ones(3, dtype=torch.long)] * 16})
    assert dock.get_rank_share("actor_train", COLS, 0) == (None, None, False)
    _fill(dock)
    assert dock.get_rank_share("actor_train", COLS, 0)[0] is not None


def test_bad_rank_or_stage_is_an_error_and_consumes_nothing():
    dock = Dock(16, 4, run_plan=_plan())
    _fill(dock)
    for rank in (-1, 4, 1.0, True):
        with pytest.raises(ValueError, match="dp_rank"):
            dock.get_rank_share("actor_train", COLS, rank)
    with pytest.raises(ValueError, match="no stage 'ref_log_prob'"):
        dock.get_rank_share("ref_log_prob", COLS, 0)
    assert int(dock.experience_consumer_status["actor_train"].sum()) == 0
    with pytest.raises(ValueError, match="run_plan"):
        Dock(16, 4).get_rank_share("actor_train", COLS, 0)


def test_random_split_when_unbalanced_is_seeded_per_round_and_logged():
    plan = _plan(balanced=False)
    rounds = []
    dock = Dock(16, 4, run_plan=plan)
    for _ in range(2):
        dock.clear()
        _fill(dock)
        rounds.append(_take_all(dock, [0, 1, 2, 3] * 2))
        metrics = dock.get_metrics().compute()
        assert metrics["dp_balance/actor_train/imbalance"] > 0
    again = Dock(16, 4, run_plan=plan)
    again.clear()
    _fill(again)
    assert _take_all(again, [3, 2, 1, 0] * 2) == rounds[0]  # same seed, same round: same split
    assert rounds[0] != rounds[1]  # a new round draws a new split


def test_tiny_config_plan_drives_the_dock():
    plan = build_configs(load_config("configs/grpo_tiny_cpu.yaml",
                                     ["megatron_training.model_path=/unused"])).plan
    dock = Dock(plan.prompts_per_round, plan.n_samples, run_plan=plan)
    _fill(dock)
    stage = plan.stages["actor_train"]
    sizes = [len(dock.get_rank_share("actor_train", COLS, r)[1])
             for _ in range(stage.shares_per_rank) for r in range(plan.layout.dp)]
    assert sizes == [stage.rows_per_share] * (stage.shares_per_rank * plan.layout.dp)
    assert all(dock_done(dock, r) for r in range(plan.layout.dp))
