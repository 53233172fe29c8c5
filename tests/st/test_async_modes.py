"""The async trainer modes end to end through the CLI's run() (local Ray, CPU, tiny model, DP=2, two rollout
engines): separate_async with max_staleness 0 is the sync run number for number; one step off trains each batch
on rows of the weights before; with partial rollout the engines run the pool's passes, and a resume in the middle
of a stream continues it exactly, the engines' older weights and the pass in flight included. (DAPO's refills from
the engines: tests/ut/dapo/test_dapo_async.py; a resume of whole batches made ahead, through the pipeline file:
tests/ut/trainer/test_async_pipeline.py.)"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "grpo_tiny_cpu.yaml")
KEYS = ("reward/mean", "actor/pg_loss", "actor/kl", "actor/grad_norm", "response_length/mean")
# the async modes correct for staleness with the engines' log-probs (on by default)
BASE = []
# an engine's log-probs come from its own unwrapped copy of the model, equal to the trainer's up to the last bits
# of float32: the comparison with sync runs without the correction
PLAIN = BASE + ["rl_config.rollout_correction={rollout_is: null}"]
IS_KEY = "rollout_corr/rollout_is_mean"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny") / "model")


def _numbers(history):
    return [{k: m[k] for k in KEYS} for m in history]


def test_separate_async_without_staleness_is_sync_and_one_step_off_trains_on_older_rows(tiny_model, tmp_path):
    sync = run(CONFIG, PLAIN + ["megatron_training.train_iters=2"], str(tmp_path / "sync"), tiny_model)
    level = run(CONFIG, PLAIN + ["megatron_training.train_iters=2", "rl_config.trainer_mode=separate_async",
                                 "rl_config.max_staleness=0"], str(tmp_path / "level"), tiny_model)
    # the engines got every update before sampling the next batch: the same rows, the same numbers
    assert _numbers(level) == _numbers(sync)
    assert [m["async/staleness_max"] for m in level] == [0, 0]
    assert [m["async/weight_version"] for m in level] == [1, 2]
    off = run(CONFIG, BASE + ["megatron_training.train_iters=3", "rl_config.trainer_mode=colocate_async"],
              str(tmp_path / "off"), tiny_model)
    # batch 1 comes from the starting weights either way; batches 2 and 3 from the weights one update before
    for key in ("reward/mean", "response_length/mean"):
        assert off[0][key] == sync[0][key]
    assert [m["async/staleness_max"] for m in off] == [0, 1, 1] == [m["async/staleness_mean"] for m in off]
    assert [m["async/stale_rows"] for m in off] == [0, 32, 32]
    assert off[1]["response_length/mean"] != sync[1]["response_length/mean"]
    for m in off:  # the correction weighed the rows by the engines' log-probs; the idle figures are fractions
        assert IS_KEY in m and IS_KEY not in sync[0]
        assert 0 <= m["async/trainer_idle_fraction"] <= 1 and 0 <= m["async/engine_idle_fraction"] <= 1
        assert {"timing/actor_rollout/rank0", "timing/actor_rollout/rank1"} <= set(m)


def test_partial_rollout_passes_on_the_engines_resume_in_the_middle_of_a_stream(tiny_model, tmp_path):
    # the engines run the carry pool's passes beside training; after iteration 3 a pass sampled by the engines'
    # version 2 is in flight: the checkpoint keeps its rows apart from the pool, and the resume collects them
    # where the uninterrupted run did
    schedule = BASE + ["megatron_training.train_iters=5", "rl_config.trainer_mode=separate_async",
                       "rl_config.partial_rollout_max_split=3", "rl_config.parameter_sync_step=2",
                       "rl_config.max_staleness=2", "megatron_training.save_interval=3"]
    save = str(tmp_path / "ckpt")
    whole = run(CONFIG, schedule + [f"megatron_training.save={save}"], str(tmp_path / "whole"), tiny_model)
    assert [m["async/batches_ahead"] for m in whole[:4]] == [0, 1, 1, 1]  # passes beside training
    assert max(m["async/staleness_max"] for m in whole) == 2 and all(IS_KEY in m for m in whole)
    assert sum(m["partial_rollout/continued_rows"] for m in whole) > 0  # rows cut and continued
    assert os.path.exists(os.path.join(save, "iter_0000003", "carry_pool.pt"))
    resumed = run(CONFIG, schedule + [f"megatron_training.load={save}/iter_0000003",
                                      f"megatron_training.save={tmp_path}/ckpt_b"], str(tmp_path / "b"), tiny_model)
    assert _numbers(resumed) == _numbers(whole[3:])
    timeline = [json.loads(x) for x in open(tmp_path / "whole" / "timeline.jsonl")]
    assert {s["lane"] for s in timeline} == {"trainer", "engine 0", "engine 1"}
    assert any(s["what"].startswith("pass ") for s in timeline)
