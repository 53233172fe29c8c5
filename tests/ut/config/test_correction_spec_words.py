"""correction_spec word for word: every message, the plan line, and how thresholds are read."""
import pytest

from mindspeed_rl.plan.rollout_correction import CorrectionSpec, correction_spec
from mindspeed_rl.models.loss.rollout_correction import RejectRule

S = "rl_config.rollout_correction"


def _error(raw):
    with pytest.raises(ValueError) as err:
        correction_spec(raw, partial=False)
    return str(err.value)


def test_the_plan_line_names_weights_bounds_rules_and_bypass():
    spec = CorrectionSpec("token", 2.0, None, (RejectRule("token_k1", 2.0, 0.5), RejectRule("seq_max_k3", 0.25)))
    assert spec.describe() == ("rollout correction: token-level IS weights truncated at 2; rejection "
                               "token_k1 in [0.5, 2], seq_max_k3 <= 0.25")
    assert CorrectionSpec("sequence", 3.0, 0.5).describe() == (
        "rollout correction: sequence-level IS weights [0.5, 3] (outside: 0)")
    assert CorrectionSpec(None, bypass_mode=True).describe() == (
        "rollout correction: bypass mode (the engine's log-probs are the old log-probs)")


def test_thresholds_are_read_as_numbers_pairs_and_k1_ranges():
    assert correction_spec({"rollout_is_threshold": "0.5_3"}, False).is_lower == 0.5
    assert correction_spec({"rollout_is_threshold": " 4 "}, False).is_upper == 4.0
    for u in (0.5, 2, "2"):  # a single k1 threshold u is the ratio range [1/u, u], whichever side u is given
        rule = correction_spec({"rollout_rs": "token_k1", "rollout_rs_threshold": u}, False).rules[0]
        assert (rule.lower, rule.upper) == (0.5, 2.0)
    rule = correction_spec({"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.25_3"}, False).rules[0]
    assert (rule.lower, rule.upper) == (0.25, 3.0)
    shared = correction_spec({"rollout_rs": "token_k2,seq_mean_k3,seq_max_k2", "rollout_rs_threshold": 0.5}, False)
    assert [(r.option, r.upper, r.lower) for r in shared.rules] == [("token_k2", 0.5, None), ("seq_mean_k3", 0.5, None),
                                                                    ("seq_max_k2", 0.5, None)]
    each = correction_spec({"rollout_rs": "token_k2,seq_mean_k3", "rollout_rs_threshold": "0.1, 0.2"}, False)
    assert [r.upper for r in each.rules] == [0.1, 0.2]
    twice = correction_spec({"rollout_rs": "token_k2, token_k2", "rollout_rs_threshold": 1}, False)
    assert len(twice.rules) == 1


@pytest.mark.parametrize("raw,message", [
    ({"rollout_is_threshold": None}, f"{S}.rollout_is_threshold=None must be a positive number or a 'lower_upper' string"),
    ({"rollout_is_threshold": True}, f"{S}.rollout_is_threshold=True must be a positive number or a 'lower_upper' string"),
    ({"rollout_is_threshold": "a_b"}, f"{S}.rollout_is_threshold='a_b' is not a number or a 'lower_upper' pair"),
    ({"rollout_is_threshold": "1_2_3"}, f"{S}.rollout_is_threshold='1_2_3' is not a number or a 'lower_upper' pair"),
    ({"rollout_is_threshold": [2]}, f"{S}.rollout_is_threshold=[2] is not a number or a 'lower_upper' pair"),
    ({"rollout_is_threshold": float("inf")}, f"{S}.rollout_is_threshold=inf: bounds must be finite and positive"),
    ({"rollout_is_threshold": "nan"}, f"{S}.rollout_is_threshold='nan': bounds must be finite and positive"),
    ({"rollout_is_threshold": "0_2"}, f"{S}.rollout_is_threshold='0_2': bounds must be finite and positive"),
    ({"rollout_is_threshold": "3_1"}, f"{S}.rollout_is_threshold='3_1': the lower bound exceeds the upper"),
    ({"rollout_rs": "token_k2", "rollout_rs_threshold": True}, f"{S}.rollout_rs_threshold=True must be a positive "
                                                               f"number"),
    ({"rollout_rs": "token_k2", "rollout_rs_threshold": "x"}, f"{S}.rollout_rs_threshold='x' is not a number"),
    ({"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1_0.2"}, f"{S}.rollout_rs_threshold='0.1_0.2' is not a "
                                                                    f"number"),
    ({"rollout_rs": 5}, f"{S}.rollout_rs=5 must be null or comma separated options of ['token_k1', 'token_k2', "
                        f"'token_k3', 'seq_sum_k1', 'seq_sum_k2', 'seq_sum_k3', 'seq_mean_k1', 'seq_mean_k2', "
                        f"'seq_mean_k3', 'seq_max_k2', 'seq_max_k3']"),
    ({"rollout_rs": "token_k2,seq_max_k1", "rollout_rs_threshold": 1},
     f"{S}.rollout_rs: 'seq_max_k1' is not one of ['token_k1', 'token_k2', 'token_k3', 'seq_sum_k1', 'seq_sum_k2', "
     f"'seq_sum_k3', 'seq_mean_k1', 'seq_mean_k2', 'seq_mean_k3', 'seq_max_k2', 'seq_max_k3']"),
    ({"rollout_rs": "token_k2"}, f"{S}.rollout_rs='token_k2' needs rollout_rs_threshold"),
    ({"rollout_rs": "token_k2,token_k3,seq_sum_k2", "rollout_rs_threshold": "1,2"},
     f"{S}.rollout_rs_threshold gives 2 thresholds for 3 options (one for all, or one each)"),
    ({"rollout_is": "row"}, f"{S}.rollout_is='row' must be null, 'token' or 'sequence'"),
    ({"bypass_mode": 1}, f"{S}.bypass_mode=1 must be true or false"),
    ({"rollout_is_batch_normalize": "no"}, f"{S}.rollout_is_batch_normalize='no' must be true or false"),
    ({"rollout_is_batch_normalize": True}, f"{S}.rollout_is_batch_normalize=true is not implemented (weights are "
                                           f"used as computed)"),
    ({"loss_type": "reinforce"}, f"{S}.loss_type='reinforce': only 'ppo_clip' is implemented"),
    ({"bypass_mode": True, "rollout_is": "token"}, f"{S}.bypass_mode=true takes the engine's log-probs as the old "
     f"ones (the PPO ratio is the correction): set rollout_is and rollout_rs to null; weights or rejection on top of it "
     f"are not implemented"),
    ({"what": 1}, f"{S}.what is not a rollout correction key; known: ['rollout_is', 'rollout_is_threshold', "
                  f"'rollout_rs', 'rollout_rs_threshold', 'bypass_mode', 'loss_type', 'rollout_is_batch_normalize']"),
    ([1], f"{S} must be a mapping of ['rollout_is', 'rollout_is_threshold', 'rollout_rs', 'rollout_rs_threshold', "
          f"'bypass_mode', 'loss_type', 'rollout_is_batch_normalize'], got list"),
])
def test_every_bad_setting_is_one_message(raw, message):
    assert _error(raw) == message


def test_bypass_with_a_null_rollout_is_is_accepted():
    assert correction_spec({"bypass_mode": True, "rollout_is": None}, partial=True) == CorrectionSpec(
        None, bypass_mode=True)


def test_equal_bounds_and_truncations_at_one_or_above_are_accepted():
    assert correction_spec({"rollout_is_threshold": "2_2"}, False).is_lower == 2.0
    assert correction_spec({"rollout_is_threshold": 1.0}, False).is_upper == 1.0
    assert correction_spec({"rollout_is_threshold": 1.5}, False).is_upper == 1.5
