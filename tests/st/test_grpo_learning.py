"""GRPO really learns: on the toy 'length' task (see shared notes) the reward
climbs from ~0.45 (random model) to > 0.8, which needs conditioning on the
prompt (ignoring it scores at most 0.75)."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grpo_tiny_cpu.yaml")


# FSDP is left out for CI time: it matches DDP to 1e-4 over two iterations (tests/st/test_grpo_system.py) and learned
# alike here (last-5 0.941 vs DDP's 0.946 at 45 iterations, 2026-12-06)
@pytest.mark.parametrize("engine", ["ddp", "ddp-partial"])
def test_reward_rises_on_length_task_with_dp_balance(tmp_path, engine):
    # ddp-partial: partial rollout in 2 passes with its default rollout correction (token-level IS weights)
    partial = ["rl_config.partial_rollout_max_split=2"] if engine.endswith("partial") else []
    overrides = partial + [
        "megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8",
        "rl_config.mini_batch_size=8", "rl_config.init_kl_coef=0.0", "megatron_training.train_iters=45",
        "rl_config.seed=7", "megatron_training.use_distributed_optimizer=false"]
    history = run(CONFIG, overrides, str(tmp_path), str(tmp_path / "tiny_model"))
    rewards = np.array([m["reward/mean"] for m in history])
    first, last = rewards[:5].mean(), rewards[-5:].mean()
    print(f"reward first-5 {first:.3f} last-5 {last:.3f}")
    assert last > 0.8
    assert last - first > 0.25
    # responses move away from the length cap as the model learns L
    assert history[-1]["response_length/mean"] < history[0]["response_length/mean"]
