"""The KL coefficient's controllers (rl_config.kl_ctrl_type) against their formula."""
import pytest

from mindspeed_rl.algorithms.kl import AdaptiveKLController, FixedKLController


@pytest.mark.parametrize("kl, error", [(0.11, 0.1), (0.0, -0.2), (5.0, 0.2), (0.095, -0.05)])
def test_adaptive_moves_by_the_clipped_proportional_error(kl, error):
    ctrl = AdaptiveKLController(0.5, target_kl=0.1, horizon=100)
    ctrl.update(kl, 10)
    assert ctrl.value == pytest.approx(0.5 * (1 + error * 10 / 100))


def test_a_horizon_must_be_positive_and_one_step_is_enough():
    assert AdaptiveKLController(0.1, 1.0, horizon=1).horizon == 1
    with pytest.raises(ValueError, match="kl_horizon must be positive, got 0"):
        AdaptiveKLController(0.1, 1.0, horizon=0)


def test_fixed_never_moves():
    ctrl = FixedKLController(0.3)
    ctrl.update(100.0, 1000)
    assert ctrl.value == 0.3
