"""GRPO end to end through cli/train_grpo.py with a tiny Qwen3 and a tiny Qwen3-MoE (DP=2, 2 iterations)."""
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")


@pytest.mark.parametrize("model,architecture", [("tiny_qwen3", "Qwen3ForCausalLM"),
                                                ("tiny_qwen3_moe", "Qwen3MoeForCausalLM")])
def test_grpo_runs_with_family(model, architecture, tmp_path):
    # the tiny CPU config with its model section swapped (configs/model/<model>.yaml)
    text = open(CONFIG, encoding="utf-8").read().replace("tiny_qwen2", model)
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "grpo.yaml"
    config.write_text(text, encoding="utf-8")
    model_dir = tmp_path / "model"
    history = run(str(config), ["megatron_training.train_iters=2", "rl_config.actor_resource.num_npus=2"],
                  str(tmp_path / "out"), str(model_dir))
    with open(model_dir / "config.json", encoding="utf-8") as f:
        assert json.load(f)["architectures"] == [architecture]  # the family the model section names
    assert len(history) == 2
    for m in history:
        assert np.isfinite(m["actor/pg_loss"]) and np.isfinite(m["actor/grad_norm"]) and m["actor/grad_norm"] > 0
        assert m["actor/skipped_steps"] == 0
        assert {"timing/actor_train/rank0", "timing/actor_train/rank1"} <= set(m)
