"""PPO's configs plan: upstream's ppo_qwen25_32b_A3.yaml as shipped, and the tiny PPO config's variants."""
import warnings
from pathlib import Path

import pytest

import cli.train_grpo as cli
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.loader import ConfigError
from mindspeed_rl.plan.run_plan import PlanError
from mindspeed_rl.reports.memory_plan import plan_memory

ROOT = Path(__file__).resolve().parents[3]
UPSTREAM = ROOT / "tests/data/upstream_configs/05a90d7/configs/ppo_qwen25_32b_A3.yaml"
TINY = ROOT / "configs/ppo_tiny_cpu.yaml"
BASE = ["megatron_training.model_path=/unused"]


def _build(path, *overrides):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfgs = build_configs(load_config(path, list(overrides)))
    return cfgs, [str(w.message) for w in caught]


def test_upstream_ppo_config_plans_actor_and_critic_groups(capsys):
    cfgs, notes = _build(UPSTREAM)
    plan = cfgs.plan
    assert plan.roles == ("actor", "critic")
    assert (plan.layout.world_size, plan.layout.dp, plan.layout.tp) == (32, 4, 8)
    assert (plan.critic.layout.world_size, plan.critic.layout.dp, plan.critic.layout.tp) == (32, 4, 8)
    # init_kl_coef 0, no KL in the reward, one mini-batch of the whole round: no reference, no old log-probs
    assert list(plan.stages) == ["actor_rollout", "rule_reward", "critic_compute_values", "compute_advantage",
                                 "critic_train", "actor_train"]
    assert plan.gae.gamma == 1.0 and plan.gae.lam == 1.0 and not plan.gae.kl_in_reward
    assert plan.critic.worker.optimizer.lr == 5e-6 and plan.worker.optimizer.lr == 1e-6  # each section's own
    assert plan.critic.worker.loss.cliprange_value == 0.5
    assert not any("lam" in n or "gamma" in n or "cliprange_value" in n for n in notes), notes
    actor, critic = plan_memory(cfgs, "actor"), plan_memory(cfgs, "critic")
    assert 0 < critic.params < actor.params  # the value head replaces the 152k-vocabulary LM head
    assert critic.reference == 0
    lines = cli.dry_run(str(UPSTREAM))
    assert any(line.startswith("memory plan (critic): DP=4 TP=8 (32 devices") for line in lines)
    assert any("critic DP=4 TP=8 (32 workers, fsdp engine)" in line for line in lines)


def test_tiny_ppo_stages_follow_the_kl_and_batch_settings():
    plan = _build(TINY, *BASE)[0].plan
    assert list(plan.stages) == ["actor_rollout", "rule_reward", "actor_log_prob", "critic_compute_values",
                                 "compute_advantage", "critic_train", "actor_train"]
    values, train = plan.stages["critic_compute_values"], plan.stages["critic_train"]
    assert values.balanced and train.balanced and (train.rows_per_share, train.shares_per_rank) == (8, 2)
    assert set(plan.stages["compute_advantage"].outputs) == {"advantages", "returns"}
    assert {"values", "returns"} <= set(train.inputs)
    # the KL in the rewards: reference and old log-probs, then compute_kl, whose rewards GAE reads
    plan = _build(TINY, *BASE, "rl_config.use_kl_in_reward=true", "rl_config.init_kl_coef=0.05",
                  "rl_config.mini_batch_size=8")[0].plan
    names = list(plan.stages)
    assert names.index("ref_log_prob") < names.index("compute_kl") < names.index("compute_advantage")
    assert "actor_log_prob" in names  # on-policy, but the KL needs the rollout policy's log-probs first
    assert "token_level_rewards" in plan.stages["compute_advantage"].inputs
    assert plan.features.kl_in_reward and not plan.features.kl_in_loss
    # on-policy without KL in the rewards: no old log-probs
    plan = _build(TINY, *BASE, "rl_config.mini_batch_size=8")[0].plan
    assert "actor_log_prob" not in plan.stages and "ref_log_prob" not in plan.stages


def test_critic_layout_and_spec_come_from_critic_config():
    cfgs, _ = _build(TINY, *BASE, "critic_config.micro_batch_size=4", "rl_config.critic_resource.num_npus=1",
                     "critic_config.lr=0.01")
    critic = cfgs.plan.critic
    assert (critic.layout.world_size, critic.layout.dp) == (1, 1)
    assert critic.worker.optimizer.lr == 0.01 and cfgs.plan.worker.optimizer.lr == 1e-3
    assert critic.worker.micro_batches.size("micro_batch_size") == 4
    assert cfgs.plan.worker.micro_batches.size("micro_batch_size") == 2
    group = cfgs.plan.for_group("critic")
    assert group.layout is critic.layout and group.worker is critic.worker and group.stages is cfgs.plan.stages
    # the critic's stages are cut for its own DP size
    assert cfgs.plan.stages["critic_train"].shares_per_rank == 2 and cfgs.plan.stages["critic_train"].rows_per_share == 16


@pytest.mark.parametrize("overrides, error, match", [
    (["megatron_training.stage=ray_grpo"], ConfigError, "read by PPO only"),
    (["rl_config.adv_estimator=group_norm"], PlanError, "PPO trains a critic for GAE"),
    (["megatron_training.stage=ray_grpo", "rl_config.adv_estimator=gae"],
     ConfigError, "read by PPO only"),
    (["rl_config.critic_resource=null"], PlanError, "needs rl_config.critic_resource.num_npus"),
    (["critic_config.save=/elsewhere", "actor_config.save=/ckpt"], ConfigError, "critic_config.save='/elsewhere'"),
    (["rl_config.filter_groups_enable=true", "rl_config.filter_groups_metric=length_match",
      "rl_config.filter_groups_train_batch_size=8"], PlanError,
     "dynamic sampling"),
    (["rl_config.lam=1.5"], PlanError, r"rl_config.lam=1.5 must be a number in \[0, 1\]"),
    (["rl_config.critic_resource.num_npus=3"], PlanError, "critic's data parallel size 3"),
    (["critic_config.tensor_model_parallel_size=3"], PlanError,
     "critic_resource.num_npus=2 must be divisible by critic_config.tensor_model_parallel_size=3"),
])
def test_ppo_config_errors_name_the_key(overrides, error, match):
    with pytest.raises(error, match=match):
        _build(TINY, *BASE, *overrides)


def test_gae_and_kl_in_reward_need_ppo():
    with pytest.raises(PlanError, match="needs a critic"):
        _build(ROOT / "configs/grpo_tiny_cpu.yaml", *BASE, "rl_config.adv_estimator=gae")
    with pytest.raises(PlanError, match="use_kl_in_reward=true is read by PPO only"):
        _build(ROOT / "configs/grpo_tiny_cpu.yaml", *BASE, "rl_config.use_kl_in_reward=true")
    _, notes = _build(ROOT / "configs/grpo_tiny_cpu.yaml", *BASE, "rl_config.lam=0.9")
    assert any("rl_config.lam=0.9 is not implemented: group_norm advantages use no GAE" in n for n in notes)
