"""The algorithm line the console and the dry run print first: the trainer that runs and its features."""
import os
import warnings

import pytest

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.algorithm_line import algorithm_line

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
GRPO = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
PPO = os.path.join(ROOT, "configs", "ppo_tiny_cpu.yaml")
DAPO = os.path.join(ROOT, "tests", "data", "upstream_configs", "05a90d7", "configs", "dapo_qwen3_32b_A3.yaml")


def _line(config, *overrides):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfgs = build_configs(load_config(config, ["megatron_training.model_path=/unused", *overrides]))
    return algorithm_line(cfgs.plan, cfgs.actor_config.stage)


def test_grpo():
    assert _line(GRPO) == (
        "algorithm: GRPO (megatron_training.stage=ray_grpo): advantages group_norm over 4 samples per prompt; "
        "clip 0.2; token-level loss; KL in the loss (low_var_kl); 2 optimizer steps per round")


def test_dapo_on_the_grpo_job_says_what_it_leaves_off():
    assert _line(GRPO, "megatron_training.stage=ray_dapo", "rl_config.token_level_loss=false",
                 "rl_config.init_kl_coef=0", "rl_config.mini_batch_size=32") == (
        "algorithm: DAPO (megatron_training.stage=ray_dapo): advantages group_norm over 4 samples per prompt; "
        "dynamic sampling off (filter_groups_enable: false); overlong penalty off; clip 0.2; sequence-mean loss; "
        "no KL (init_kl_coef 0); on-policy (one optimizer step per round)")


def test_upstreams_dapo_names_every_feature():
    assert _line(DAPO) == (
        "algorithm: DAPO (megatron_training.stage=ray_dapo): advantages group_norm over 8 samples per prompt; "
        "dynamic sampling on 'acc_for_dapo' (keeps 32 groups, no batch limit); overlong penalty over the last "
        "512 of 2048 tokens (factor 0.1); clip-higher (0.2, 0.28); token-level loss; no KL (init_kl_coef 0); "
        "on-policy (one optimizer step per round)")
    assert "at most 3 batches" in _line(DAPO, "rl_config.filter_groups_max_batches=3")


@pytest.mark.parametrize("in_reward, kl", [("false", "KL in the loss (kl)"), ("true", "KL in the rewards (kl)")])
def test_ppo(in_reward, kl):
    assert _line(PPO, "rl_config.init_kl_coef=0.05", f"rl_config.use_kl_in_reward={in_reward}",
                 "rl_config.kl_penalty=kl", "rl_config.gamma=0.99") == (
        "algorithm: PPO (megatron_training.stage=ray_ppo): critic DP=2 TP=1, GAE gamma=0.99 lam=0.95, value clip "
        f"0.5; clip 0.2; token-level loss; {kl}; 2 optimizer steps per round")


@pytest.mark.parametrize("overrides, name, says", [
    (["rl_config.adv_estimator=rloo"], "RLOO", "advantages rloo over 4 samples"),
    (["rl_config.adv_estimator=grpo", "rl_config.norm_adv_by_std_in_grpo=false",
      "rl_config.loss_agg_mode=seq-mean-token-sum-norm", "rl_config.loss_scale_factor=12"], "Dr.GRPO",
     "advantages group_norm without std (Dr.GRPO) over 4 samples per prompt; clip 0.2; loss "
     "seq-mean-token-sum-norm over 12 tokens;"),
    (["rl_config.loss_mode=cispo", "rl_config.clip_higher_enable=true", "rl_config.clip_ratio_low=1.0"], "CISPO",
     "clip-higher (1, 0.1); policy loss cispo; token-level loss"),
    (["megatron_training.stage=ray_dapo", "rl_config.adv_estimator=reinforce_plus_plus_baseline",
      "rl_config.loss_mode=gspo", "rl_config.loss_agg_mode=seq-mean-token-sum"], "DAPO + REINFORCE++-baseline + GSPO",
     "policy loss gspo; loss seq-mean-token-sum;"),
])
def test_a_registered_algorithm_names_the_run(overrides, name, says):
    line = _line(GRPO, *overrides)
    assert line.startswith(f"algorithm: {name} (megatron_training.stage=") and says in line
