"""The algorithm line's edge cases: the batch limit of dynamic sampling at 0 and 1, and a job that names no
``megatron_training.stage`` (GRPO, shown as its default stage)."""
import os
import warnings

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.algorithm_line import algorithm_line

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GRPO = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
DAPO = os.path.join(ROOT, "tests", "data", "upstream_configs", "05a90d7", "configs", "dapo_qwen3_32b_A3.yaml")


def _configs(config, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_configs(load_config(config, ["megatron_training.model_path=/unused", *overrides]))


def _line(config, *overrides):
    cfgs = _configs(config, *overrides)
    return algorithm_line(cfgs.plan, cfgs.actor_config.stage)


def test_a_batch_limit_of_zero_means_no_limit():
    line = _line(DAPO, "rl_config.filter_groups_max_batches=0")
    assert "(keeps 32 groups, no batch limit)" in line
    assert "at most" not in line


def test_a_batch_limit_of_one_is_named():
    assert "(keeps 32 groups, at most 1 batches)" in _line(DAPO, "rl_config.filter_groups_max_batches=1")


def test_no_stage_is_grpo_under_its_default_stage_name():
    plan = _configs(GRPO).plan
    line = algorithm_line(plan, None)
    assert line.startswith("algorithm: GRPO (megatron_training.stage=ray_grpo): ")
    assert line == algorithm_line(plan, "ray_grpo")
