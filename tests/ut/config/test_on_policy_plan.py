"""The on-policy shortcut: no old-log-prob stage only when the round is one
optimizer step (one mini-batch, one epoch), so the update's own log-probs are
the old ones. Any other run needs the frozen log-probs of the round's start."""
from pathlib import Path

import pytest

from mindspeed_rl.plan import build_configs, load_config

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"
OLD = "actor_log_prob"


def _plan(*overrides):
    return build_configs(load_config(TINY, list(overrides))).plan


@pytest.mark.parametrize("mini_batch_size,epochs,on_policy", [
    (8, 1, True),    # 8 prompts x 4 samples = the whole round, one epoch
    (8, 2, False),   # the second epoch trains on weights the first one moved
    (8, 3, False),
    (4, 1, False),   # two mini-batches: the second one runs after an optimizer step
    (2, 1, False),
])
def test_old_log_probs_are_computed_unless_the_round_is_one_step(mini_batch_size, epochs, on_policy):
    plan = _plan(f"rl_config.mini_batch_size={mini_batch_size}", f"rl_config.epochs={epochs}")
    assert plan.steps_per_iteration == (1 if on_policy else plan.mini_batches * epochs)
    assert (OLD not in plan.stages) == on_policy
    assert plan.computes_old_log_prob == (not on_policy)
    inputs = getattr(plan.stages["actor_train"], "inputs", None)  # the update reads what the stage writes
    if inputs:
        assert ("old_log_prob" in inputs) == (not on_policy)


def test_shortcut_does_not_depend_on_the_reference_or_balance():
    for extra in (["rl_config.init_kl_coef=0.0"], ["rl_config.use_dp_batch_balance=false"]):
        assert OLD not in _plan("rl_config.mini_batch_size=8", *extra).stages
        assert OLD in _plan("rl_config.mini_batch_size=8", "rl_config.epochs=2", *extra).stages
