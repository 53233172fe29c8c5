"""PPO (stage ray_ppo) through the CLI's run(): upstream's PPO config shrunk by overrides trains, a resume
with the critic continues exactly, and PPO learns the toy length task (CPU, tiny Qwen2, actor and critic DP=2)."""
import os
import sys

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
from cli.train_grpo import run  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from upstream_shrink import UPSTREAM_CONFIGS, tiny_shape  # noqa: E402

TINY = os.path.join(ROOT, "configs", "ppo_tiny_cpu.yaml")
UPSTREAM = os.path.join(UPSTREAM_CONFIGS, "05a90d7", "configs", "ppo_qwen25_32b_A3.yaml")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny") / "model")


def test_upstream_ppo_config_shrunk_by_overrides_trains_two_iterations(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the file's relative paths (load: ./ckpt) resolve in here
    model_dir = tmp_path / "model"
    overrides = tiny_shape("qwen25_32b") + [
        f"megatron_training.tokenizer_name_or_path={model_dir}", "megatron_training.data_path=toy:length",
        "megatron_training.global_batch_size=4", "megatron_training.seq_length=32",
        "megatron_training.train_iters=2", "actor_config.tensor_model_parallel_size=1",
        "critic_config.tensor_model_parallel_size=1", f"actor_config.save={tmp_path / 'ckpt'}",
        f"critic_config.save={tmp_path / 'ckpt'}", "rl_config.actor_resource.num_npus=2",
        "rl_config.critic_resource.num_npus=2", "rl_config.n_samples_per_prompt=4",
        "rl_config.max_prompt_length=8", "rl_config.verifier_function=[length_match]",
        "generate_config.max_model_len=64", "generate_config.sampling_config.max_tokens=10",
        "generate_config.rollout_backend=hf",
    ]
    history = run(UPSTREAM, overrides, str(tmp_path / "out"), str(model_dir))
    out = capsys.readouterr().out
    assert "critic DP=2 TP=1 (2 workers, fsdp engine)" in out  # the file's distributed optimizer, both groups
    assert len(history) == 2
    for m in history:
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
            assert np.isfinite(m[key]), key
        assert m["critic/grad_norm"] > 0 and m["actor/grad_norm"] > 0
        assert {"timing/critic_train/rank0", "timing/critic_train/rank1", "timing/critic_compute_values/max"} <= set(m)
    saved = tmp_path / "ckpt" / "iter_0000002"
    assert (saved / "dcp" / ".metadata").is_file() and (saved / "critic_dcp" / ".metadata").is_file()


def _numbers(history):
    keys = sorted(k for k in history[0] if k.startswith(("actor/", "critic/", "advantages/", "reward/",
                                                         "response_length/")))
    return [{k: m[k] for k in keys} for m in history]


def test_resume_with_the_critic_continues_exactly(tiny_model, tmp_path):
    save = tmp_path / "ckpt"
    overrides = ["megatron_training.train_iters=3", f"megatron_training.save={save}",
                 "megatron_training.save_interval=2", "critic_config.lr_decay_style=cosine",
                 "critic_config.min_lr=1.0e-4", "rl_config.epochs=2"]
    straight = run(TINY, overrides, str(tmp_path / "a"), tiny_model)
    assert (save / "iter_0000002" / "critic_dcp" / ".metadata").is_file()
    assert (save / "iter_0000002" / "critic_rng" / "rank1.pt").is_file()
    resumed = run(TINY, overrides + [f"megatron_training.load={save}/iter_0000002",
                                     f"megatron_training.save={tmp_path}/ckpt_b"], str(tmp_path / "b"), tiny_model)
    assert len(resumed) == 1
    assert "critic/vf_loss" in resumed[0] and "critic/lr" in resumed[0]
    assert _numbers(resumed) == _numbers(straight[2:])  # bit for bit on CPU, the critic's numbers included


def test_ppo_learns_the_length_task(tiny_model, tmp_path):
    """Same bar as GRPO's learning test: > 0.8 needs conditioning on the prompt (ignoring it scores <= 0.75)."""
    overrides = ["megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8",
                 "rl_config.mini_batch_size=8", "megatron_training.train_iters=40", "rl_config.seed=7"]
    history = run(TINY, overrides, str(tmp_path), tiny_model)
    rewards = np.array([m["reward/mean"] for m in history])
    first, last = rewards[:5].mean(), rewards[-5:].mean()
    print(f"reward first-5 {first:.3f} last-5 {last:.3f}")
    assert last > 0.8
    assert last - first > 0.25
    values = [m["critic/values_mean"] for m in history]
    assert abs(values[-1] - rewards[-1]) < abs(values[0] - rewards[0])  # the critic tracks the return
