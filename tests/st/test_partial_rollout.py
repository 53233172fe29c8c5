"""Partial rollout end to end through the CLI's run() (CPU, tiny model, DP=2): rows carried between
iterations, the correction's metrics, and a resume in the middle of carried rows equal to the straight run."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402
from mindspeed_rl.trainer.partial_rollout import POOL_FILE  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grpo_tiny_cpu.yaml")
KEYS = ("reward/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean", "rollout_corr/rollout_is_mean",
        "partial_rollout/passes", "partial_rollout/continued_tokens")


PINNED = ("partial_rollout/passes", "partial_rollout/rows_left_in_queue", "partial_rollout/continued_tokens",
          "partial_rollout/carried_rows", "response_length/mean", "reward/mean")
# the async run's figures per iteration (one engine, takes of 2 rows: the same interleaving every run), in PINNED's
# order: passes, rows left in the queue when a pass stopped, tokens carried in from earlier iterations, rows carried
# out, mean response length and reward of the trained rows
ASYNC_FIGURES = [[5, 0, 0, 0, 19.375, 0.1640625], [0, 0, 288, 16, 18.0, 0.1015625],
                 [3, 9, 0, 10, 6.5, 0.546875], [3, 7, 136, 7, 13.5625, 0.28125]]


def _numbers(history):
    return [{k: m.get(k) for k in KEYS} for m in history]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_resume_in_the_middle_of_carried_rows_equals_the_straight_run(tmp_path, mode):
    tiny = str(tmp_path / "tiny")
    save = str(tmp_path / "ckpt")
    # async: takes of 2 rows, so that rows are still queued when enough prompts are complete; one engine, so that
    # where a pass stops does not depend on how two engines' reports interleave (it does with several)
    extra = ["rl_config.async_engine=true", "rl_config.actor_rollout_dispatch_size=2",
             "rl_config.actor_resource.num_npus=1"] if mode == "async" else []
    # a random tiny model rarely ends early: 24 tokens in passes of 5 leave rows cut in the middle at a save
    overrides = extra + ["rl_config.partial_rollout_max_split=5", "rl_config.n_samples_per_prompt=2",
                 "generate_config.sampling_config.max_tokens=24", "megatron_training.train_iters=4",
                 f"megatron_training.save={save}", "megatron_training.save_interval=1"]
    straight = run(CONFIG, overrides, str(tmp_path / "a"), tiny)
    if mode == "async":  # the figures of this code, pinned: a change that moves both runs alike is seen too
        assert [m.get(k) for m in straight for k in PINNED] == pytest.approx(sum(ASYNC_FIGURES, []))
    # rows really were carried: some trained tokens were sampled an iteration earlier, under older weights
    assert any(m["partial_rollout/continued_tokens"] > 0 for m in straight)
    assert any(m["rollout_corr/rollout_is_max"] != 1.0 for m in straight)
    if mode == "async":  # some passes stopped with rows still in the queue
        assert any(m["partial_rollout/rows_left_in_queue"] > 0 for m in straight)
    else:
        assert all("partial_rollout/rows_left_in_queue" not in m for m in straight)
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


def test_ppo_and_dapo_train_on_carried_rows_with_the_correction(tmp_path):
    tiny = str(tmp_path / "tiny")
    ppo = os.path.join(os.path.dirname(CONFIG), "ppo_tiny_cpu.yaml")
    history = run(ppo, ["rl_config.partial_rollout_max_split=2", "megatron_training.train_iters=2"],
                  str(tmp_path / "ppo"), tiny)
    # iteration 2 trains the groups completed in iteration 1, under weights updated since: weights != 1
    assert history[1]["partial_rollout/passes"] == 0 and history[1]["partial_rollout/token_age_max"] == 1
    assert history[1]["rollout_corr/rollout_is_max"] != 1.0
    assert all(abs(m["critic/vf_loss"]) < 1e3 for m in history)
    # DAPO with dynamic sampling on the pool: each take of 8 complete groups is filtered, and more passes and
    # takes follow until 4 varying groups are kept
    history = run(CONFIG, ["megatron_training.stage=ray_dapo", "rl_config.clip_higher_enable=true",
                           "rl_config.clip_ratio_high=0.28", "rl_config.filter_groups_enable=true",
                           "rl_config.filter_groups_metric=length_match", "rl_config.filter_groups_train_batch_size=4",
                           "rl_config.filter_groups_max_batches=4", "rl_config.mini_batch_size=4",
                           "rl_config.partial_rollout_max_split=2", "megatron_training.train_iters=2"],
                  str(tmp_path / "dapo"), tiny)
    for m in history:
        assert m["dapo/kept_groups"] + m["dapo/dropped_groups"] == 8 * m["dapo/rollout_batches"]
        assert 1 <= m["dapo/train_groups"] <= min(4, m["dapo/kept_groups"])
        assert {"partial_rollout/passes", "actor/clip_frac_high"} <= set(m)
    # iteration 2 trains rows carried from iteration 1, under weights updated since
    assert history[1]["partial_rollout/token_age_max"] >= 1 and history[1]["rollout_corr/rollout_is_max"] != 1.0
