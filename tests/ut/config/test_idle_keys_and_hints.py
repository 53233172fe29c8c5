"""Said, not silent: a misspelled algorithm name gets a 'did you mean', and a key that does nothing in the run's
setting says so in one line (a warning in the run, a note in --dry-run)."""
import os
import sys
import warnings

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, ROOT)
from cli.train_grpo import main  # noqa: E402
from mindspeed_rl.plan import build_configs, load_config  # noqa: E402

TINY = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
MULTI_TURN = os.path.join(ROOT, "tests", "data", "upstream_configs", "05a90d7", "configs",
                          "dapo_qwen25_7b_A2_multi_turn.yaml")


@pytest.mark.parametrize("override,line", [
    ("rl_config.adv_estimator=rlooo", "error: rl_config.adv_estimator='rlooo' is not a known advantage estimator "
                                      "(did you mean 'rloo'?); known: ["),
    ("rl_config.loss_mode=gspoo", "error: rl_config.loss_mode='gspoo' is not a known policy loss (did you mean "
                                  "'gspo'?); known: ['cispo', 'gspo', 'vanilla']"),
    ("rl_config.loss_agg_mode=token_mean", "error: rl_config.loss_agg_mode='token_mean' is not one of "
                                           "['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', "
                                           "'seq-mean-token-sum-norm'] (did you mean 'token-mean'?)"),
])
def test_a_misspelled_algorithm_name_gets_a_did_you_mean_in_one_line(capsys, override, line):
    assert main(["--config", TINY, "--dry-run", override]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1


def test_a_name_far_from_every_known_one_gets_no_guess(capsys):
    assert main(["--config", TINY, "--dry-run", "rl_config.adv_estimator=remax"]) == 2
    assert "did you mean" not in capsys.readouterr().err


def _lines(*overrides, config=TINY):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_configs(load_config(config, ["megatron_training.model_path=/unused", *overrides]))
    return [str(w.message) for w in caught if "has no effect" in str(w.message)]


def test_loss_scale_factor_without_the_norm_aggregation_says_it_does_nothing():
    assert _lines("rl_config.loss_scale_factor=512") == [
        "rl_config.loss_scale_factor=512.0 has no effect: it is the length that loss_agg_mode "
        "seq-mean-token-sum-norm divides by, and this run aggregates with token-mean"]
    assert _lines("rl_config.loss_scale_factor=512", "rl_config.loss_agg_mode=seq-mean-token-sum-norm") == []


def test_the_std_switch_with_another_estimator_says_it_does_nothing():
    assert _lines("rl_config.adv_estimator=rloo", "rl_config.norm_adv_by_std_in_grpo=false") == [
        "rl_config.norm_adv_by_std_in_grpo=false has no effect: only adv_estimator group_norm (grpo) divides by "
        "the group's std, and this run's estimator is rloo"]
    assert _lines("rl_config.adv_estimator=grpo", "rl_config.norm_adv_by_std_in_grpo=false") == []  # Dr.GRPO
    assert _lines("rl_config.adv_estimator=rloo") == []  # the default (true) was not asked for


def test_a_critic_resource_without_a_critic_says_it_does_nothing():
    line = ("rl_config.critic_resource has no effect: it places PPO's critic group, and this run trains no critic "
            "(megatron_training.stage is not ray_ppo)")
    assert _lines("rl_config.critic_resource={num_npus: 1, custom_resources: {node_b: 1}}") == [line]
    ppo = os.path.join(ROOT, "configs", "ppo_tiny_cpu.yaml")
    assert _lines(config=ppo) == []  # PPO places its critic by it


def test_async_engine_without_partial_rollout_says_it_does_nothing(capsys):
    line = ("rl_config.async_engine=true has no effect: it stops partial rollout's passes early, and partial "
            "rollout is off (rl_config.partial_rollout_max_split=1; set it above 1, as upstream pairs the two)")
    assert _lines("rl_config.async_engine=true") == [line]
    assert _lines("rl_config.async_engine=true", "rl_config.partial_rollout_max_split=2",
                  "rl_config.guarantee_order=false") == []
    # upstream's multi-turn DAPO config sets it without partial rollout: the dry run notes it once
    assert main(["--config", MULTI_TURN, "--dry-run"]) == 0
    assert capsys.readouterr().out.count(f"note: {line}\n") == 1
