"""rl_config.rollout_balance and upstream's guarantee_order name one setting: either key sets both, both given
must agree, and the run plan serves the rollout stage from the queue or from fixed shares by it."""
import pytest

from mindspeed_rl.plan.loader import build_configs, load_config
from mindspeed_rl.config_cls.rl_config import RLConfig

TINY = "configs/grpo_tiny_cpu.yaml"


@pytest.mark.parametrize("given,mode", [
    ({}, "queue"),
    ({"rollout_balance": "static"}, "static"),
    ({"guarantee_order": True}, "static"),
    ({"guarantee-order": True}, "static"),
    ({"guarantee_order": False, "rollout_balance": "queue"}, "queue"),
    ({"guarantee_order": True, "rollout_balance": "static"}, "static"),
])
def test_either_key_sets_both(given, mode):
    rl = RLConfig(given)
    assert (rl.rollout_balance, rl.guarantee_order) == (mode, mode == "static")


def test_a_later_update_with_one_key_moves_both():
    rl = RLConfig({"rollout_balance": "static"})
    rl.update({"guarantee_order": False})
    assert (rl.rollout_balance, rl.guarantee_order) == ("queue", False)
    rl.update({"rollout_balance": "static"})
    assert (rl.rollout_balance, rl.guarantee_order) == ("static", True)


@pytest.mark.parametrize("given,message", [
    ({"rollout_balance": "balanced"}, "rl_config.rollout_balance must be one of ('queue', 'static'), got 'balanced'"),
    ({"guarantee_order": True, "rollout_balance": "queue"},
     "rl_config.guarantee_order=True and rollout_balance='queue' disagree"),
])
def test_bad_or_disagreeing_keys_are_one_error(given, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RLConfig(given)


@pytest.mark.parametrize("override,queued", [
    ([], True), (["rl_config.rollout_balance=static"], False), (["rl_config.guarantee_order=true"], False)])
def test_the_plan_queues_rollout_by_the_key(override, queued):
    plan = build_configs(load_config(TINY, override)).plan
    assert plan.stages["actor_rollout"].queued is queued
