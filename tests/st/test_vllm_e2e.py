"""GRPO and DAPO end to end through the CLI with the vLLM rollout backend (CPU, tiny model, DP=2): the run
learns from vLLM's samples drawn from the rollout queue, resumes exactly (with the static split too: the same
rows), logs the engines' log-prob drift, and a worker killed while vLLM generates ends the run in one line
naming it."""
import os
import signal
import sys
import time

import numpy as np
import pytest

from vllm_need import need_vllm

need_vllm()
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli.train_grpo import run  # noqa: E402
from fault_drill import Run  # noqa: E402
from upstream_shrink import UPSTREAM_CONFIGS, tiny_shape  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
# vLLM's CPU attention needs a head size of 32 or more: 2 heads of 32 in the tiny model
VLLM = ["generate_config.rollout_backend=vllm", "generate_config.dtype=float32", "generate_config.max_num_seqs=16",
        "megatron_training.num_attention_heads=2", "megatron_training.num_query_groups=2"]
KEYS = ("reward/mean", "actor/pg_loss", "actor/kl", "actor/grad_norm", "actor/lr", "response_length/mean",
        "actor/rollout_log_prob_abs_diff")


def _numbers(history):
    return [{k: m[k] for k in KEYS} for m in history]


def test_grpo_on_vllm_trains_logs_drift_and_resumes_exactly(tmp_path, capsys):
    model = str(tmp_path / "model")
    save = str(tmp_path / "ckpt")
    overrides = VLLM + ["megatron_training.train_iters=3", f"megatron_training.save={save}",
                        "megatron_training.save_interval=2", "actor_config.lr_decay_style=cosine",
                        "actor_config.min_lr=1.0e-4"]
    straight = run(CONFIG, overrides, str(tmp_path / "a"), model)
    out = capsys.readouterr().out
    assert "rollout: vLLM (generate_config.rollout_backend=vllm, vLLM" in out
    assert len(straight) == 3
    for m in straight:
        assert np.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0
        # both engines compute float32 log-probs of the same tokens with the same weights
        assert 0 <= m["actor/rollout_log_prob_abs_diff"] < 1e-3 and abs(m["actor/rollout_log_prob_k3_kl"]) < 1e-4
    # the policy moved and vLLM followed it: responses differ in length between iterations
    assert len({m["response_length/mean"] for m in straight}) > 1
    for m in straight:  # both engines drew from the one queue; every row made once
        rows = [m[f"dp_balance/actor_rollout/rows/rank{e}"] for e in (0, 1)]
        assert min(rows) > 0 and sum(rows) == 32
        assert m["dp_balance/actor_rollout/bound_s"] <= m["dp_balance/actor_rollout/stage_s"]
    # resumed with the static split (guarantee_order): every row samples with its own seed, so the queue's rows
    # and the fixed shares' rows are the same, and the resumed run repeats the straight one number for number
    resumed = run(CONFIG, overrides + [f"megatron_training.load={save}/iter_0000002", "rl_config.guarantee_order=true",
                                       f"megatron_training.save={tmp_path}/ckpt_b"], str(tmp_path / "b"), model)
    assert "dp_balance/actor_rollout/rows/rank0" not in resumed[0]
    assert _numbers(resumed) == _numbers(straight[2:])


def test_dapo_on_vllm_trains_with_dynamic_sampling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = os.path.join(UPSTREAM_CONFIGS, "05a90d7", "configs", "dapo_qwen3_32b_A3.yaml")
    model_dir = tmp_path / "model"
    overrides = tiny_shape("qwen3_32b") + [
        "model.qwen3_32b.kv_channels=32", "generate_config.rollout_backend=vllm", "generate_config.dtype=float32",
        "generate_config.max_num_seqs=16", f"megatron_training.tokenizer_name_or_path={model_dir}",
        "megatron_training.data_path=toy:length", "megatron_training.global_batch_size=4",
        "megatron_training.seq_length=32", "megatron_training.train_iters=2",
        "actor_config.tensor_model_parallel_size=1", "actor_config.finetune=false", "actor_config.load=null",
        "actor_config.save=null", "rl_config.actor_resource.num_npus=2", "rl_config.n_samples_per_prompt=4",
        "rl_config.max_prompt_length=8", "rl_config.mini_batch_size=4", "rl_config.use_dp_batch_balance=true",
        "rl_config.verifier_function=[length_match]", "rl_config.filter_groups_metric=length_match",
        "rl_config.filter_groups_train_batch_size=4", "rl_config.filter_groups_max_batches=4",
        "rl_config.rollout_max_tokens=10", "rl_config.overlong_buffer=4",
        "generate_config.max_model_len=64", "generate_config.sampling_config.max_tokens=10",
    ]
    history = run(config, overrides, str(tmp_path / "out"), str(model_dir))
    assert len(history) == 2
    for m in history:
        assert np.isfinite(m["actor/pg_loss"])
        assert m["dapo/kept_groups"] + m["dapo/dropped_groups"] == 4 * m["dapo/rollout_batches"]
        # the drift columns travel through the group filter to the train stage
        assert 0 <= m["actor/rollout_log_prob_abs_diff"] < 1e-3


def test_worker_killed_while_vllm_generates_is_named_in_one_line(tmp_path):
    # long rollouts (64 rows of up to 56 tokens, 4 at a time per engine) so that the kill lands while vLLM generates
    args = [sys.executable, "cli/train_grpo.py", "--config", CONFIG, "--tiny-model-dir", str(tmp_path / "model"),
            "--output-dir", str(tmp_path / "out"), "megatron_training.train_iters=2",
            "megatron_training.global_batch_size=16", "megatron_training.seq_length=64",
            "generate_config.sampling_config.max_tokens=56", "rl_config.mini_batch_size=64",
            "generate_config.max_num_seqs=4", *VLLM[:2], *VLLM[3:]]
    run_ = Run(args, str(tmp_path / "log.txt"))
    # Ray titles a worker's process with the method it runs: the first rollout is its queued stage (the engines
    # are up by then)
    deadline, pids = time.monotonic() + 600, []
    while not pids and time.monotonic() < deadline:
        pids = run_.actors("ray::IntegratedWorker.run_queued_stage")
        time.sleep(0.02)
    assert pids, "no worker entered the first rollout"
    time.sleep(1.0)  # inside vLLM's generation
    os.kill(pids[0], signal.SIGKILL)
    rc, left = run_.finish(300)
    _, line = run_.error_line()
    assert rc == 1 and left == 0
    assert line.startswith("error: worker rank ") and "failed in 'actor_rollout'" in line, line
    assert not run_.traceback()


def test_multi_turn_on_vllm_with_free_routing_carries_cut_conversations(tmp_path):
    """The toy tool task on two vLLM engines with free routing and partial rollout: a conversation's turn after its
    tool round goes back to the queue (which engine runs it is the unit tests'), a pass may cut it (its turns carried
    to the next pass; the handoff round ends once every row is complete or cut), and the rollout log-probs of the
    model's tokens stay the trainer's own across passes and engines (IS weights 1 within an iteration). It also
    stands for single-turn partial rollout on vLLM: a row continued on whichever engine takes it."""
    tools = os.path.join(ROOT, "configs", "tools", "toy_secret.yaml")
    history = run(CONFIG, VLLM + [
        "megatron_training.data_path=toy:tool", 'rl_config.verifier_function=["tool_match"]',
        "rl_config.multi_turn_enable=true", f"rl_config.tool_config_path={tools}", "rl_config.max_tool_calls=1",
        "rl_config.multi_turn_routing=free",
        "rl_config.max_parallel_calls=1", "rl_config.max_total_response_length=8",
        "generate_config.sampling_config.max_tokens=2", "rl_config.partial_rollout_max_split=3",
        "megatron_training.global_batch_size=8", "rl_config.n_samples_per_prompt=8", "rl_config.mini_batch_size=16",
        "megatron_training.train_iters=2"], str(tmp_path / "a"), str(tmp_path / "model"))
    keys = ("multi_turn/tool_calls_per_row", "partial_rollout/continued_rows", "multi_turn/turns_moved_fraction",
            "multi_turn/tool_token_fraction", "partial_rollout/token_age_max", "rollout_corr/rollout_is_max",
            "rollout_corr/rollout_is_min")
    seen = [{k: m.get(k) for k in keys} for m in history]
    assert sum(m["multi_turn/tool_calls_per_row"] for m in history) > 0, seen
    assert sum(m["partial_rollout/continued_rows"] for m in history) > 0, seen  # cut conversations carried on
    for m in history:  # the model's tokens' rollout log-probs are the trainer's own, across passes and engines
        if m["partial_rollout/token_age_max"] == 0:
            assert abs(m["rollout_corr/rollout_is_max"] - 1) < 1e-3 and abs(m["rollout_corr/rollout_is_min"] - 1) < 1e-3
