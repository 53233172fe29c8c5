"""rl_config.stage_timeout and td_timeout as the run plan hands them to each worker group."""
from pathlib import Path

import pytest

from mindspeed_rl.plan import build_configs, load_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def _plan(name, *overrides):
    return build_configs(load_config(CONFIGS / name, ["megatron_training.model_path=/unused", *overrides])).plan


@pytest.mark.parametrize("name", ["grpo_tiny_cpu.yaml", "ppo_tiny_cpu.yaml"])
def test_stage_timeout_reaches_every_worker_group(name):
    plan = _plan(name, "rl_config.stage_timeout=45", "rl_config.td_timeout=120")
    for role in plan.roles:
        timeouts = plan.for_group(role).timeouts
        assert timeouts.stage == 45.0 and timeouts.stage_deadline == 45.0
        assert timeouts.td_timeout == 120.0 and timeouts.placement == 120.0
        assert timeouts.collective == 180.0  # a rank's collective outlasts the driver's deadline


def test_without_stage_timeout_the_deadline_is_td_timeout():
    plan = _plan("grpo_tiny_cpu.yaml", "rl_config.td_timeout=120")
    assert plan.timeouts.stage_deadline == 120.0 and plan.timeouts.collective == 180.0
    longer = _plan("grpo_tiny_cpu.yaml", "rl_config.stage_timeout=300", "rl_config.td_timeout=120")
    assert longer.timeouts.collective == 360.0
