"""partial_spec on its own: the keys' checks word for word, the spec's fields and its plan line."""
from types import SimpleNamespace

import pytest

from mindspeed_rl.plan.partial_rollout import PartialSpec, partial_spec

GEN = SimpleNamespace(sampling_config={"max_tokens": 8})


def _rl(**kw):
    base = dict(partial_rollout_max_split=2, async_engine=False, require_max_age_all_finished=True,
                rollout_balance="queue", filter_groups_enable=False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_the_spec_carries_every_setting():
    spec = partial_spec(_rl(async_engine=True, require_max_age_all_finished=False), GEN, 4)
    assert spec == PartialSpec(2, 8, 4, 8, async_engine=True, max_age_finished=False)
    assert partial_spec(_rl(), GEN, 4) == PartialSpec(2, 8, 4, 8, async_engine=False, max_age_finished=True)
    assert partial_spec(_rl(partial_rollout_max_split=8), GEN, 4).pass_tokens == 1  # N = max_tokens: one each
    assert partial_spec(_rl(partial_rollout_max_split=3), GEN, 4).pass_tokens == 3
    assert partial_spec(_rl(partial_rollout_max_split=1, rollout_balance="static"), GEN, 4) is None


def test_the_plan_line_says_budget_pool_and_async():
    assert PartialSpec(3, 10, 8, 16).describe() == (
        "partial rollout: at most 4 new tokens per row per pass (max_tokens=10 / partial_rollout_max_split=3); "
        "up to 16 prompts in flight, 8 complete prompts train per iteration")
    assert PartialSpec(3, 10, 8, 16).describe(filtered=True).endswith(
        "up to 16 prompts in flight, takes of 8 complete prompts go to dynamic sampling's filter")
    assert PartialSpec(3, 10, 8, 16, async_engine=True).describe().endswith(
        "train per iteration; a pass stops once they are complete (async_engine)")


@pytest.mark.parametrize("kw,message", [
    (dict(partial_rollout_max_split=True), "rl_config.partial_rollout_max_split=True must be an int >= 1 (1: off)"),
    (dict(partial_rollout_max_split=1.5), "rl_config.partial_rollout_max_split=1.5 must be an int >= 1 (1: off)"),
    (dict(partial_rollout_max_split=0), "rl_config.partial_rollout_max_split=0 must be an int >= 1 (1: off)"),
    (dict(async_engine="yes"), "rl_config.async_engine='yes' must be true or false"),
    (dict(require_max_age_all_finished=1), "rl_config.require_max_age_all_finished=1 must be true or false"),
    (dict(rollout_balance="static"), "rl_config.rollout_balance must be 'queue' (guarantee_order false) when "
     "partial_rollout_max_split > 1 "
                                 "(carried rows continue on whichever engine takes them from the rollout queue)"),
    (dict(partial_rollout_max_split=9), "rl_config.partial_rollout_max_split=9 exceeds sampling_config.max_tokens=8: "
                                        "a pass must make at least one token"),
])
def test_bad_settings_are_named_word_for_word(kw, message):
    with pytest.raises(ValueError) as err:
        partial_spec(_rl(**kw), GEN, 4)
    assert str(err.value) == message
