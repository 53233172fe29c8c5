"""DAPO end to end through cli/train_grpo.py: upstream's dapo_qwen3_32b_A3.yaml (05a90d7), as shipped,
shrunk to a tiny Qwen3 by overrides only, trains 3 iterations on DP=2 (CPU) with every DAPO switch the
file sets: token-level loss, clip-higher, overlong penalty, dynamic sampling (here with DP balance on);
then resumes from iteration 1 (refills included) and compares every metric of iterations 2 and 3 with the
uninterrupted run's."""
import json
import os
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
from cli.train_grpo import run  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from upstream_shrink import UPSTREAM_CONFIGS, tiny_shape  # noqa: E402
from mindspeed_rl.utils.checkpoint import read_state  # noqa: E402

CONFIG = os.path.join(UPSTREAM_CONFIGS, "05a90d7", "configs", "dapo_qwen3_32b_A3.yaml")
TINY = tiny_shape("qwen3_32b")


def test_dapo_qwen3_32b_config_shrunk_trains_and_resumes_exactly(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    model_dir = tmp_path / "model"
    overrides = TINY + [
        f"megatron_training.tokenizer_name_or_path={model_dir}",
        "megatron_training.data_path=toy:length", "megatron_training.global_batch_size=4",
        "megatron_training.seq_length=32", "megatron_training.train_iters=3",
        "actor_config.tensor_model_parallel_size=1", "actor_config.finetune=false", "actor_config.load=null",
        f"actor_config.save={tmp_path / 'ckpt'}", "megatron_training.save_interval=1",
        "rl_config.actor_resource.num_npus=2", "rl_config.n_samples_per_prompt=4", "rl_config.max_prompt_length=8",
        "rl_config.mini_batch_size=4", "rl_config.use_dp_batch_balance=true",
        "rl_config.verifier_function=[length_match]", "rl_config.filter_groups_metric=length_match",
        "rl_config.filter_groups_train_batch_size=4", "rl_config.filter_groups_max_batches=4",
        "rl_config.rollout_max_tokens=10", "rl_config.overlong_buffer=4",
        "generate_config.max_model_len=64", "generate_config.sampling_config.max_tokens=10",
    ]
    history = run(CONFIG, overrides, str(tmp_path / "out"), str(model_dir))
    out = capsys.readouterr().out
    assert "run plan: layout DP=2 TP=1 (2 workers, fsdp engine); 16 rows per round" in out
    # the run says first that DAPO runs, with its features
    assert ("algorithm: DAPO (megatron_training.stage=ray_dapo): advantages group_norm over 4 samples per prompt; "
            "dynamic sampling on 'length_match' (keeps 4 groups, at most 4 batches); overlong penalty over the last "
            "4 of 10 tokens") in out
    assert out.index("algorithm: DAPO") < out.index("run plan:")
    with open(model_dir / "config.json", encoding="utf-8") as f:
        assert json.load(f)["architectures"] == ["Qwen3ForCausalLM"]
    assert len(history) == 3
    batches = 0
    for m in history:
        assert np.isfinite(m["actor/pg_loss"]) and m["actor/grad_norm"] > 0
        # dynamic sampling: every rolled-out group is kept or dropped; at most the train batch is trained
        assert m["dapo/kept_groups"] + m["dapo/dropped_groups"] == 4 * m["dapo/rollout_batches"]
        assert 1 <= m["dapo/train_groups"] <= min(4, m["dapo/kept_groups"])
        batches += m["dapo/rollout_batches"]
        # the loss's clip fractions and the overlong penalty (max 10 tokens, buffer 4) are logged
        assert {"actor/clip_frac_low", "actor/clip_frac_high"} <= set(m)
        assert -0.1 <= m["reward/overlong_penalty/mean"] <= 0 and 0 <= m["reward/overlong_penalty/frac"] <= 1
        # the train stage was balanced over both ranks, whatever the kept row count
        assert {"dp_balance/actor_train/rank0", "dp_balance/actor_train/rank1"} <= set(m)
    # the checkpoint's data position is the number of prompt batches taken, refills included
    state = read_state(str(tmp_path / "ckpt" / "iter_0000003"))
    assert state["data_position"] == batches
    assert "dapo: batches=" in out

    # resumed from iteration 1 (upstream's no_load_optim / no_load_rng off): iteration 2 again, equal in
    # every metric but the clocks; the refills of iteration 1 place the data iterator
    assert read_state(str(tmp_path / "ckpt" / "iter_0000001"))["data_position"] > 1, "no refill in iteration 1"
    resumed = run(CONFIG, overrides + [
        f"actor_config.load={tmp_path / 'ckpt' / 'iter_0000001'}", "actor_config.no_load_optim=false",
        "actor_config.no_load_rng=false", f"actor_config.save={tmp_path / 'ckpt_b'}"],
        str(tmp_path / "out_b"), str(model_dir))
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("resumed from")]
    assert said == [f"resumed from {tmp_path / 'ckpt' / 'iter_0000001'} at iteration 1: restored weights, optimizer "
                    f"state, RNG state, KL coefficient and data position"]
    assert len(resumed) == 2
    clocks = ("timing/", "memory/")
    for straight, again in zip(history[1:], resumed):  # every iteration after the resume, bit for bit
        want = {k: v for k, v in straight.items() if not k.startswith(clocks)}
        got = {k: v for k, v in again.items() if not k.startswith(clocks)}
        assert sorted(got) == sorted(want)
        assert [k for k in want if got[k] != want[k]] == []
