"""The run plan with partial rollout and rollout correction: which stages run, what they read, the checks."""
from pathlib import Path

import pytest

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.rollout_correction import CorrectionSpec

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"


def _plan(*overrides):
    return build_configs(load_config(TINY, list(overrides))).plan


def test_partial_rollout_plans_a_pool_budgets_and_the_correction():
    plan = _plan("rl_config.partial_rollout_max_split=3")
    assert (plan.partial.max_split, plan.partial.pass_tokens, plan.partial.pool_prompts) == (3, 4, 16)
    assert plan.dock_prompts == 16 and plan.prompts_per_round == 8
    assert plan.stages["actor_rollout"].inputs == ("prompts", "rollout_budget")
    assert plan.correction == CorrectionSpec("token", 2.0)
    assert list(plan.stages) == ["actor_rollout", "rule_reward", "compute_advantage", "ref_log_prob",
                                 "actor_log_prob", "rollout_correction", "actor_train"]
    assert {"rollout_is_weights", "response_mask", "rollout_log_probs"} <= set(plan.stages["actor_train"].inputs)
    assert plan.worker.rollout.returns_log_probs  # transformers generate returns them for the correction
    lines = plan.long_tail_lines()
    assert lines[0].startswith("partial rollout: at most 4 new tokens") and "token-level IS" in lines[1]


def test_split_one_and_no_correction_plan_what_they_always_did():
    default, explicit = _plan(), _plan("rl_config.partial_rollout_max_split=1")
    assert default == explicit and default.partial is None and not default.correction.on
    assert default.long_tail_lines() == []
    assert "rollout_budget" not in default.stages["actor_rollout"].inputs
    assert not default.worker.rollout.returns_log_probs  # transformers generate: tokens only


def test_correction_forces_the_old_log_probs_even_on_policy():
    on_policy = ("rl_config.mini_batch_size=8",)
    assert "actor_log_prob" not in _plan(*on_policy).stages
    plan = _plan(*on_policy, "rl_config.rollout_correction={rollout_is: sequence}")
    assert "actor_log_prob" in plan.stages and "rollout_correction" in plan.stages


def test_bypass_mode_skips_the_old_log_probs_and_the_correction_stage():
    plan = _plan("rl_config.rollout_correction={bypass_mode: true}")
    assert plan.features.bypass and not plan.features.rollout_correction
    assert "actor_log_prob" not in plan.stages and "rollout_correction" not in plan.stages
    assert "rollout_log_probs" in plan.stages["actor_train"].inputs
    assert "bypass mode" in plan.long_tail_lines()[0]


@pytest.mark.parametrize("overrides,match", [
    (("rl_config.partial_rollout_max_split=2", "rl_config.guarantee_order=true"),
     r"rollout_balance must be 'queue' \(guarantee_order false\)"),
    (("rl_config.partial_rollout_max_split=0",), "must be an int >= 1"),
    (("rl_config.partial_rollout_max_split=11",), "exceeds sampling_config.max_tokens=10"),
    (("rl_config.rollout_correction={rollout_is: tokens}",), "rollout_is='tokens'"),
    (("rl_config.async_engine=1",), "async_engine expects bool"),
])
def test_bad_settings_are_one_error_naming_the_key(overrides, match):
    with pytest.raises(Exception, match=match):
        _plan(*overrides)


def test_the_kl_in_the_rewards_keeps_the_old_log_probs_even_on_policy_or_in_bypass_mode():
    ppo = TINY.parent / "ppo_tiny_cpu.yaml"
    for extra in ((), ("rl_config.rollout_correction={bypass_mode: true}",)):
        plan = build_configs(load_config(ppo, ["rl_config.use_kl_in_reward=true", "rl_config.mini_batch_size=8",
                                               *extra])).plan
        assert plan.features.kl_in_reward and plan.features.on_policy
        assert "actor_log_prob" in plan.stages, extra


TOOLS = str(Path(__file__).resolve().parents[3] / "configs" / "tools" / "toy_secret.yaml")
MULTI_TURN = ("rl_config.multi_turn_enable=true", f"rl_config.tool_config_path={TOOLS}", "rl_config.max_tool_calls=1",
              "rl_config.max_parallel_calls=1",
              "rl_config.max_total_response_length=12", "generate_config.sampling_config.max_tokens=4")


def test_a_multi_turn_pools_budget_is_the_whole_conversation_and_its_state_travels():
    plan = _plan(*MULTI_TURN, "rl_config.partial_rollout_max_split=5")
    # max_total_response_length, not a turn's max_tokens, is a row's budget: 12 / 5 -> 3 per pass
    assert (plan.partial.max_tokens, plan.partial.pass_tokens) == (12, 3)
    assert plan.partial.budget_key == "rl_config.max_total_response_length"
    assert plan.features.carried_turns
    assert plan.stages["actor_rollout"].inputs == ("prompts", "rollout_budget", "labels", "carried_turn")
    assert plan.stages["actor_rollout"].outputs[-3:] == ("loss_mask", "tool_call_num", "turn_state")
    assert "(max_total_response_length=12 / partial_rollout_max_split=5)" in plan.long_tail_lines()[1]
    single = _plan("rl_config.partial_rollout_max_split=5")
    assert not single.features.carried_turns and "turn_state" not in single.stages["actor_rollout"].outputs
    with pytest.raises(Exception, match=r"rl_config.partial_rollout_max_split=13 exceeds "
                                        r"rl_config.max_total_response_length=12: a pass must make at least one "
                                        r"token"):
        _plan(*MULTI_TURN, "rl_config.partial_rollout_max_split=13")


def test_a_pool_names_its_runs_kind_and_budget_key():
    from mindspeed_rl.trainer.partial_rollout import pool_identity
    multi = pool_identity(_plan(*MULTI_TURN, "rl_config.partial_rollout_max_split=5"))
    single = pool_identity(_plan("rl_config.partial_rollout_max_split=5"))
    assert multi["rl_config.multi_turn_enable"] is True and multi["rl_config.max_total_response_length"] == 12
    assert "generate_config.sampling_config.max_tokens" not in multi
    assert single["rl_config.multi_turn_enable"] is False
    assert single["generate_config.sampling_config.max_tokens"] == 10
