"""value_loss's metrics at the edges: no masked token, a single token, a single non-empty row under
sequence-level normalisation, the prediction mean over real tokens only, and the missing-mask error."""
import pytest
import torch

from mindspeed_rl.models.loss.value_loss import value_loss


def test_no_masked_token_gives_zero_loss_and_metrics():
    v = torch.tensor([[0.5, 2.0]], requires_grad=True)
    loss, metrics = value_loss(v, torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1, 2), 0.2)
    assert loss.item() == 0.0
    assert metrics == {"critic/vf_loss": 0.0, "critic/vf_clipfrac": 0.0, "critic/vpred_mean": 0.0}


def test_one_clipped_token():
    # vpred 0.5 from value 2 clipped to 1.8; return 1: unclipped 0.25, clipped 0.64: 0.5 * 0.64
    loss, metrics = value_loss(torch.tensor([[0.5]]), torch.tensor([[2.0]]), torch.ones(1, 1), torch.ones(1, 1), 0.2)
    assert loss.item() == pytest.approx(0.32)
    assert metrics["critic/vf_loss"] == pytest.approx(0.32)
    assert metrics["critic/vf_clipfrac"] == 1.0 and metrics["critic/vpred_mean"] == 0.5


def test_sequence_level_counts_only_non_empty_rows():
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    v, ret = torch.zeros(2, 2), torch.tensor([[1.0, 3.0], [5.0, 5.0]])
    loss, metrics = value_loss(v, v, ret, mask, None, token_level=False)
    assert loss.item() == pytest.approx((0.5 + 4.5) / 2)  # the one row's mean
    assert metrics["critic/vf_loss"] == pytest.approx(2.5)


def test_prediction_mean_is_over_real_tokens():
    vpreds = [torch.tensor([1.0, 3.0, 5.0]), torch.tensor([6.0])]
    _, metrics = value_loss(vpreds, vpreds, vpreds, None, None)
    assert metrics["critic/vpred_mean"] == pytest.approx(15.0 / 4)
    assert metrics["critic/vf_loss"] == 0.0


def test_padded_tensors_need_the_mask():
    v = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"^mask is needed with padded tensors$"):
        value_loss(v, v, v, None, 0.2)
