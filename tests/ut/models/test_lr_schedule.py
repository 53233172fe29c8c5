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
