import pytest

from mindspeed_rl.algorithms import ADV_ESTIMATORS, POLICY_LOSSES, get_adv_estimator_fn
from mindspeed_rl.algorithms.registry import Registry


def test_built_in_names_are_registered():
    assert {"group_norm", "grpo", "gae", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"} <= \
        set(ADV_ESTIMATORS.names())
    assert {"vanilla", "gspo", "cispo"} <= set(POLICY_LOSSES.names())
    assert get_adv_estimator_fn("grpo") is get_adv_estimator_fn("group_norm")  # verl's name is an alias
    assert ADV_ESTIMATORS.meta("gae")["critic"] and not ADV_ESTIMATORS.meta("rloo").get("critic")


def test_unknown_name_names_the_key_and_the_known_ones():
    with pytest.raises(ValueError, match=r"rl_config.adv_estimator='remax' is not a known advantage estimator; "
                                         r"known: \[.*'rloo'"):
        get_adv_estimator_fn("remax")


def test_a_second_function_under_a_taken_name_is_refused_and_the_first_stays():
    reg = Registry("thing", "key")

    @reg.register("a", aliases=("b",), flag=1)
    def first():
        pass

    def second():
        pass
    for name in ("a", "b"):
        with pytest.raises(ValueError, match=f"thing '{name}' is registered already"):
            reg.register(name)(second)
    assert reg.get("b") is first and reg.meta("a") == {"flag": 1}
    assert reg.register("a")(first) is first  # the same function again is fine
    assert "b" in reg and "c" not in reg
