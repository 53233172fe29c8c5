"""A checkpoint records the algorithm it trained; a resume that trains another one says what changed in one
warning line (the checkpoint's name and iteration, each changed key from -> to)."""
import os

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.algorithm_line import algorithm_change_line, algorithm_record
from mindspeed_rl.utils.checkpoint import driver_state

TINY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs", "grpo_tiny_cpu.yaml")


def _record(*overrides, stage=None):
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides]))
    return algorithm_record(cfgs.plan, stage)


def test_the_record_names_the_keys_that_choose_the_algorithm():
    assert _record() == {"name": "GRPO", "megatron_training.stage": "ray_grpo", "rl_config.adv_estimator":
                         "group_norm", "rl_config.norm_adv_by_std_in_grpo": True, "rl_config.loss_mode": "vanilla",
                         "rl_config.loss_agg_mode": "token-mean"}
    rloo = _record("rl_config.adv_estimator=rloo", "rl_config.loss_mode=gspo",
                   "rl_config.loss_agg_mode=seq-mean-token-mean", "megatron_training.stage=ray_dapo",
                   stage="ray_dapo")
    assert rloo == {"name": "DAPO + RLOO + GSPO", "megatron_training.stage": "ray_dapo",
                    "rl_config.adv_estimator": "rloo", "rl_config.norm_adv_by_std_in_grpo": True,
                    "rl_config.loss_mode": "gspo", "rl_config.loss_agg_mode": "seq-mean-token-mean"}
    assert _record("rl_config.adv_estimator=grpo")["rl_config.adv_estimator"] == "group_norm"  # the alias


def test_a_changed_algorithm_is_one_warning_naming_each_change():
    grpo = _record()
    rloo = _record("rl_config.adv_estimator=rloo", "rl_config.loss_agg_mode=seq-mean-token-mean")
    assert algorithm_change_line(grpo, rloo, "/c/iter_0000004", 4) == (
        "warning: checkpoint /c/iter_0000004 (iteration 4) was trained as GRPO; this run continues it as RLOO: "
        "rl_config.adv_estimator 'group_norm' -> 'rloo', rl_config.loss_agg_mode 'token-mean' -> "
        "'seq-mean-token-mean' (weights, optimizer state, KL coefficient and data position carry over)")
    assert algorithm_change_line(grpo, dict(grpo), "/c", 1) is None
    assert algorithm_change_line(None, rloo, "/c", 1) is None  # a checkpoint that does not record it
    unnamed = {k: v for k, v in grpo.items() if k != "name"}  # a record without its name still says the changes
    assert algorithm_change_line(unnamed, rloo, "/c", 1).startswith(
        "warning: checkpoint /c (iteration 1) was trained as ?; this run continues it as RLOO: ")
    dr = _record("rl_config.norm_adv_by_std_in_grpo=false")
    assert algorithm_change_line(grpo, dr, "/c", 2).endswith(
        "as Dr.GRPO: rl_config.norm_adv_by_std_in_grpo True -> False (weights, optimizer state, KL coefficient and "
        "data position carry over)")


def test_the_resume_carries_the_recorded_algorithm_to_the_driver():
    assert "algorithm" not in driver_state(3, {"kl_coef": 0.1})  # an older checkpoint: nothing to compare
    assert driver_state(3, {"kl_coef": 0.1, "algorithm": _record()})["algorithm"] == _record()
