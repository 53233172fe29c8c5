"""MSRL_PIN_CORES=1: a core per worker rank, as a device per rank (the actor's first, then the critic's, then the
rollout engines', colocated engines on their trainer rank's core); too few cores is one line; off by default."""
from pathlib import Path

import pytest

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.workers.scheduler import pinning

ROOT = Path(__file__).resolve().parents[3]


def _plan(config="grpo_tiny_cpu.yaml", *overrides):
    return build_configs(load_config(ROOT / "configs" / config, ["megatron_training.model_path=/unused",
                                                                 *overrides])).plan


def test_each_rank_gets_a_core_of_its_own_in_role_order():
    assert pinning.core_plan(_plan(), [4, 5, 6]) == {"actor": [4, 5]}
    separate = _plan("grpo_tiny_cpu.yaml", "rl_config.trainer_mode=separate_async")
    assert pinning.core_plan(separate, [0, 1, 2, 3]) == {"actor": [0, 1], "rollout": [2, 3]}
    colocated = _plan("grpo_tiny_cpu.yaml", "rl_config.trainer_mode=colocate_async")
    assert pinning.core_plan(colocated, [0, 1]) == {"actor": [0, 1], "rollout": [0, 1]}
    ppo = _plan("ppo_tiny_cpu.yaml", "rl_config.trainer_mode=separate_async")
    assert pinning.core_plan(ppo, list(range(6))) == {"actor": [0, 1], "critic": [2, 3], "rollout": [4, 5]}


def test_too_few_cores_is_one_line():
    separate = _plan("grpo_tiny_cpu.yaml", "rl_config.trainer_mode=separate_async")
    with pytest.raises(ValueError, match=r"^MSRL_PIN_CORES=1: the run's 4 worker ranks need as many cores; this "
                                         r"machine lets the run use 3$"):
        pinning.core_plan(separate, [0, 1, 2])


class Group:
    def __init__(self, n):
        self.actors = [type("A", (), {"pin_cores": type("M", (), {"remote": staticmethod(lambda c: ("pin", c))})})
                       for _ in range(n)]
        self.pinned = None

    def wait(self, refs, name):
        self.pinned = (name, refs)


def test_pinning_runs_only_when_asked(monkeypatch):
    plan = _plan()
    groups = {"actor": Group(2)}
    monkeypatch.delenv(pinning.ENV, raising=False)
    assert pinning.pin_groups(groups, plan) == {} and groups["actor"].pinned is None
    monkeypatch.setenv(pinning.ENV, "1")
    monkeypatch.setattr(pinning.os, "sched_getaffinity", lambda pid: {7, 3})
    assert pinning.pin_groups(groups, plan) == {"actor": [3, 7]}
    assert groups["actor"].pinned == ("pin_cores", [("pin", [3]), ("pin", [7])])
