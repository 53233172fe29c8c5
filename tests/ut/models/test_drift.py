"""The rollout drift metric's input checks and shapes."""
import pytest
import torch

from mindspeed_rl.models.rollout.drift import rollout_drift


def test_row_count_mismatch_names_both_counts():
    with pytest.raises(ValueError, match=r"rollout drift: 2 rows of rollout log-probs, 3 of the trainer's"):
        rollout_drift([torch.zeros(1)] * 2, [torch.zeros(1)] * 3)


def test_no_rows_gives_no_metrics():
    assert rollout_drift([], []) == {}


def test_rows_of_any_shape_and_dtype_are_flattened_into_one_token_mean():
    rollout = [torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16), torch.tensor([-0.5])]
    trainer = [torch.tensor([-1.5, -2.0]), torch.tensor([[-0.25]], dtype=torch.bfloat16)]
    out = rollout_drift(rollout, trainer)
    d = torch.tensor([-0.5, 0.0, 0.25])
    assert out["actor/rollout_log_prob_abs_diff"] == pytest.approx(0.25)
    assert out["actor/rollout_log_prob_k3_kl"] == pytest.approx(float((torch.expm1(d) - d).mean()), rel=1e-6)
