"""Partial rollout end to end through the CLI's run() (CPU, tiny model, DP=2): rows carried between
iterations, the correction's metrics, and a resume in the middle of carried rows equal to the straight run."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402
from mindspeed_rl.trainer.partial_rollout import POOL_FILE  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grpo_tiny_cpu.yaml")
KEYS = ("reward/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean", "rollout_corr/rollout_is_mean",
        "partial_rollout/passes", "partial_rollout/continued_tokens")


def _numbers(history):
    return [{k: m.get(k) for k in KEYS} for m in history]


def test_resume_in_the_middle_of_carried_rows_equals_the_straight_run(tmp_path):
    tiny = str(tmp_path / "tiny")
    save = str(tmp_path / "ckpt")
    overrides = ["rl_config.partial_rollout_max_split=3", "megatron_training.train_iters=4",
                 f"megatron_training.save={save}", "megatron_training.save_interval=1"]
    straight = run(CONFIG, overrides, str(tmp_path / "a"), tiny)
    # rows really were carried: some trained tokens were sampled an iteration earlier, under older weights
    assert any(m["partial_rollout/continued_tokens"] > 0 for m in straight)
    assert any(m["rollout_corr/rollout_is_max"] != 1.0 for m in straight)
    # find a checkpoint whose pool holds a row that is cut in the middle (some tokens, not complete)
    middle = None
    for it in (1, 2, 3):
        pool = torch.load(os.path.join(save, f"iter_{it:07d}", POOL_FILE), weights_only=False)
        if any(r["tokens"].numel() and not r["done"] for r in pool["rows"]):
            middle = it
            break
    assert middle is not None, "no checkpoint caught a row in the middle"
    resumed = run(CONFIG, overrides + [f"megatron_training.load={save}/iter_{middle:07d}",
                                       f"megatron_training.save={tmp_path}/ckpt_b"], str(tmp_path / "b"), tiny)
    assert _numbers(resumed) == _numbers(straight[middle:])
