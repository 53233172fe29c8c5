import pytest

from mindspeed_rl.models.lr_schedule import lr_at


def test_constant_and_warmup():
    assert lr_at(5, 1e-3) == 1e-3
    assert lr_at(0, 1e-3, warmup_steps=4) == pytest.approx(2.5e-4)
    assert lr_at(3, 1e-3, warmup_steps=4) == pytest.approx(1e-3)


def test_linear_and_cosine_reach_min_lr():
    assert lr_at(0, 1.0, 0.1, total_steps=10, style="linear") == pytest.approx(1.0)
    assert lr_at(5, 1.0, 0.1, total_steps=10, style="linear") == pytest.approx(0.55)
    assert lr_at(10, 1.0, 0.1, total_steps=10, style="linear") == pytest.approx(0.1)
    assert lr_at(5, 1.0, 0.0, total_steps=10, style="cosine") == pytest.approx(0.5)
    assert lr_at(20, 1.0, 0.2, total_steps=10, style="cosine") == pytest.approx(0.2)
    # decay starts after the warm-up
    assert lr_at(2, 1.0, 0.0, total_steps=12, warmup_steps=2, style="linear") == pytest.approx(1.0)


def test_unknown_style():
    with pytest.raises(ValueError, match="lr_decay_style"):
        lr_at(0, 1.0, style="step")


def test_decay_with_warmup_reaches_min_lr_at_the_last_step():
    """Warm-up of w steps, then the decay spans the remaining total - w steps:
    the rate after the last optimizer step (position total_steps) is min_lr."""
    linear = [lr_at(s, 1.0, 0.1, total_steps=10, warmup_steps=2, style="linear") for s in range(11)]
    assert linear[:3] == pytest.approx([0.5, 1.0, 1.0])
    assert linear[6] == pytest.approx(0.55)  # half-way through the 8 decay steps
    assert linear[9] == pytest.approx(0.2125)
    assert linear[10] == pytest.approx(0.1)
    cosine = [lr_at(s, 1.0, 0.2, total_steps=11, warmup_steps=3, style="cosine") for s in range(12)]
    assert cosine[2] == pytest.approx(1.0) and cosine[3] == pytest.approx(1.0)
    assert cosine[7] == pytest.approx(0.6)
    assert cosine[11] == pytest.approx(0.2)
    for rates in (linear[2:], cosine[3:]):
        assert all(a >= b for a, b in zip(rates, rates[1:]))  # decays, never rises


@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_rate_stays_at_min_lr_past_the_last_step(style):
    past = [lr_at(s, 1.0, 0.3, total_steps=10, warmup_steps=4, style=style) for s in (10, 11, 15, 40)]
    assert past == pytest.approx([0.3] * 4)
