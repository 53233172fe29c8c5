"""End-to-end GRPO on a local Ray (CPU, tiny model): the CLI's run() as users start it."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402
from wandb_records import offline_env, offline_runs  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grpo_tiny_cpu.yaml")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny") / "model")


def test_dp2_balance_on_runs_and_logs_balance(tiny_model, tmp_path, monkeypatch):
    offline_env(monkeypatch, tmp_path)  # rl_config.use_wandb: offline, files only
    history = run(CONFIG, ["megatron_training.train_iters=2", "rl_config.use_wandb=true",
                           "rl_config.wandb_exp_name=dp2"], str(tmp_path), tiny_model)
    assert len(history) == 2
    for m in history:
        assert m["reward/min"] <= m["reward/mean"] <= m["reward/max"]
        assert m["reward/mean"] == pytest.approx(m["reward/length_match/mean"])  # one verifier, weight 1
        for stage in ("actor_rollout", "ref_log_prob", "actor_log_prob", "actor_train"):
            assert {f"timing/{stage}/rank0", f"timing/{stage}/rank1"} <= set(m)
        for stage in ("ref_log_prob", "actor_log_prob", "actor_train"):
            assert m[f"dp_balance/{stage}/shares"] >= 2
        assert np.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0
    # balanced shares are never worse than a random split of the same pool
    stages = ("ref_log_prob", "actor_log_prob", "actor_train")
    ours = np.mean([m[f"dp_balance/{s}/imbalance"] for m in history for s in stages])
    rand = np.mean([m[f"dp_balance/{s}/imbalance_random"] for m in history for s in stages])
    assert ours < rand
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["iteration"] for r in rows] == [1, 2]
    # the same records went to wandb, at step = iteration, with the run's config
    (logged,) = offline_runs(str(tmp_path))
    assert logged["history"] == {r["iteration"]: {k: v for k, v in r.items() if k != "iteration"} for r in rows}
    assert logged["name"] == "dp2" and logged["config"]["rl_config"]["n_samples_per_prompt"] == 4
    plans = [json.loads(line) for line in open(tmp_path / "balance.jsonl")]
    assert {p["consumer"] for p in plans} == set(stages) | {"actor_rollout"}
    for p in plans:
        assert len(p["loads"]) == len(p["random_loads"]) == len(p["sizes"]) >= 2
        if p["consumer"] != "actor_rollout":
            assert sum(p["loads"]) == pytest.approx(sum(p["random_loads"]))
    _ranks_processed_their_shares(history, plans, stages)
    _both_engines_served_the_rollout_queue(history, [p for p in plans if p["consumer"] == "actor_rollout"])


def _both_engines_served_the_rollout_queue(history, plans, engines=2, rows=32):
    """The rollout's rows came from one queue: every row made once, by engines that each took chunks; the
    figures of each round are the engines' busy seconds, next to the static split replayed."""
    assert len(plans) == len(history)
    for m, plan in zip(history, plans):
        taken = [m[f"dp_balance/actor_rollout/rows/rank{e}"] for e in range(engines)]
        assert sum(taken) == rows == sum(plan["sizes"]) and plan["sizes"] == taken
        busy = [m[f"dp_balance/actor_rollout/rank{e}"] for e in range(engines)]
        assert plan["loads"] == busy and plan["served"] == "queue" and plan["objective"] == "seconds"
        assert m["dp_balance/actor_rollout/rank_imbalance"] == pytest.approx(max(busy) / np.mean(busy) - 1)
        assert m["dp_balance/actor_rollout/stage_s"] == max(busy) <= m["timing/actor_rollout/max"]
        assert m["dp_balance/actor_rollout/bound_s"] <= max(busy)
        assert m["dp_balance/actor_rollout/static_s"] == pytest.approx(max(plan["random_loads"]))


def _ranks_processed_their_shares(history, plans, stages, dp=2):
    """What DP rank r processed (reported by the worker) is the sum of the
    plan's shares r, r + dp, ... (shares bound to ranks, not first come)."""
    for stage in stages:
        stage_plans = [p for p in plans if p["consumer"] == stage]
        assert len(stage_plans) == len(history)
        for m, plan in zip(history, stage_plans):
            loads = plan["loads"]
            for r in range(dp):
                assert m[f"dp_balance/{stage}/rank{r}"] == pytest.approx(sum(loads[r::dp]))
            per_rank = [sum(loads[r::dp]) for r in range(dp)]
            assert m[f"dp_balance/{stage}/rank_imbalance"] == pytest.approx(max(per_rank) / np.mean(per_rank) - 1)


def test_tensor_parallel_group_of_two_shares_one_dock_stream(tiny_model, tmp_path):
    overrides = ["megatron_training.train_iters=1", "actor_config.tensor_model_parallel_size=2",
                 "rl_config.use_dynamic_bsz=false", "rl_config.use_remove_padding=false"]
    history = run(CONFIG, overrides, str(tmp_path), tiny_model)
    m = history[0]
    # one DP rank (TP peers get the data by broadcast): one share per plan
    assert m["dp_balance/actor_train/shares"] == 2  # two mini-batches, one rank
    assert {"timing/actor_train/rank0", "timing/actor_train/rank1"} <= set(m)
    assert m["tokens/actor_train/rank0"] == m["tokens/actor_train/rank1"]
    # transformers generate on the TP-sharded model: the TP group is one consumer of the rollout queue, its two
    # ranks generate every chunk together (the same rows, the same tokens), the TP source returns them
    assert m["dp_balance/actor_rollout/rows/rank0"] == 32 and "dp_balance/actor_rollout/rows/rank1" not in m
    assert m["tokens/actor_rollout/rank0"] == m["tokens/actor_rollout/rank1"] > 0


def test_balance_off_serves_random_shares_and_logs_their_imbalance(tiny_model, tmp_path):
    history = run(CONFIG, ["megatron_training.train_iters=1", "rl_config.use_dp_batch_balance=false"],
                  str(tmp_path), tiny_model)
    plans = [json.loads(line) for line in open(tmp_path / "balance.jsonl")]
    assert not any(p["balanced"] for p in plans if p["consumer"] != "actor_rollout")
    _ranks_processed_their_shares(history, plans, ("ref_log_prob", "actor_log_prob", "actor_train"))
    assert history[0]["tokens/actor_train/rank0"] > 0


def test_fsdp_engine_end_to_end_equals_ddp(tiny_model, tmp_path):
    """Same seed, same data: the FSDP2 engine (DP=2, balance on) reproduces the DDP run."""
    base = ["megatron_training.train_iters=2"]
    ddp = run(CONFIG, base, str(tmp_path / "ddp"), tiny_model)
    fsdp = run(CONFIG, base + ["megatron_training.use_distributed_optimizer=true"], str(tmp_path / "fsdp"), tiny_model)
    for a, b in zip(ddp, fsdp):
        for key in ("reward/mean", "actor/pg_loss", "actor/kl", "actor/grad_norm", "response_length/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key
    assert fsdp[-1]["dp_balance/actor_train/rank_imbalance"] == pytest.approx(ddp[-1]["dp_balance/actor_train/rank_imbalance"])


def test_rewards_steer_learning_the_right_way(tiny_model, tmp_path):
    """A few iterations on a fixed seed: the reward of the sampled responses
    rises and responses move off the length cap. A reward or advantage path
    that scores the wrong rows, flips or drops the advantages, or does not reach
    the update fails this (the seed-7 run goes from ~0.40 to ~0.65)."""
    overrides = ["megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8",
                 "rl_config.mini_batch_size=8", "rl_config.init_kl_coef=0.0", "rl_config.seed=7",
                 "actor_config.lr=5.0e-3", "megatron_training.train_iters=8"]
    history = run(CONFIG, overrides, str(tmp_path), tiny_model)
    rewards = np.array([m["reward/mean"] for m in history])
    lengths = np.array([m["response_length/mean"] for m in history])
    print("rewards", np.round(rewards, 3).tolist(), "lengths", np.round(lengths, 2).tolist())
    assert rewards[-3:].mean() > rewards[:2].mean() + 0.15
    assert lengths[-3:].mean() < lengths[:2].mean() - 1.5
    assert all(m["actor/grad_norm"] > 0 for m in history)
