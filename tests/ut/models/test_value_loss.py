"""PPO clipped value loss: the per-token formula, clipping and its fraction, masking, the gradient contract."""
import pytest
import torch

from mindspeed_rl.models.loss.value_loss import value_loss
from mindspeed_rl.trainer.utils.advantages import pad_rows

LENGTHS = [3, 1, 5, 2]


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = lambda: [torch.randn(n, generator=g) for n in LENGTHS]  # noqa: E731
    return rows(), rows(), rows()


def test_single_tokens_by_hand():
    # return 1, clip 0.5 around the old value:
    # vpred 2 (value 0, clipped to 0.5): clipped error 0.5 < unclipped 1, the unclipped term counts
    # vpred -1 (value 0, clipped to -0.5): clipped error 1.5 < unclipped 2, unclipped again
    # vpred 0.8 (value 2, clipped to 1.5): clipped error 0.5 > unclipped 0.2, the clipped term counts
    # vpred 0.3 (value 0.2): inside the range, both terms equal
    vpreds = torch.tensor([[2.0, -1.0, 0.8, 0.3]], requires_grad=True)
    values = torch.tensor([[0.0, 0.0, 2.0, 0.2]])
    returns = torch.ones(1, 4)
    mask = torch.ones(1, 4)
    loss, metrics = value_loss(vpreds, values, returns, mask, cliprange_value=0.5)
    expected = 0.5 * torch.tensor([1.0, 4.0, 0.25, 0.49])
    assert loss.item() == pytest.approx(float(expected.sum()))
    assert metrics["critic/vf_loss"] == pytest.approx(float(expected.mean()))
    assert metrics["critic/vf_clipfrac"] == pytest.approx(0.25)
    assert metrics["critic/vpred_mean"] == pytest.approx(0.525)
    loss.backward()
    # where the clipped term wins, the prediction is outside the clip range: no gradient
    torch.testing.assert_close(vpreds.grad, torch.tensor([[1.0, -2.0, 0.0, -0.7]]))


def test_without_clipping_is_half_mse():
    vpreds, values, returns = _batch(1)
    v, mask = pad_rows(vpreds)
    loss, metrics = value_loss(v, pad_rows(values)[0], pad_rows(returns)[0], mask, cliprange_value=None)
    sq = torch.cat([(a - b).square() for a, b in zip(vpreds, returns)])
    assert loss.item() == pytest.approx(float(0.5 * sq.sum()), rel=1e-6)
    assert metrics["critic/vf_clipfrac"] == 0.0
    # a huge clip range is the same as none
    big, _ = value_loss(v, pad_rows(values)[0], pad_rows(returns)[0], mask, cliprange_value=1e6)
    assert big.item() == pytest.approx(loss.item(), rel=1e-6)


def test_clipping_uses_the_larger_term_and_counts_it():
    vpreds, values, returns = _batch(2)
    v, mask = pad_rows(vpreds)
    old, ret = pad_rows(values)[0], pad_rows(returns)[0]
    c = 0.2
    loss, metrics = value_loss(v, old, ret, mask, cliprange_value=c)
    clipped = old + (v - old).clamp(-c, c)
    unc, cl = (v - ret).square(), (clipped - ret).square()
    per = 0.5 * torch.maximum(unc, cl)
    assert loss.item() == pytest.approx(float(per[mask].sum()), rel=1e-6)
    frac = float((cl > unc)[mask].float().mean())
    assert 0.0 < frac < 1.0  # the batch has both cases
    assert metrics["critic/vf_clipfrac"] == pytest.approx(frac)
    unclipped_loss, _ = value_loss(v, old, ret, mask, cliprange_value=None)
    assert loss.item() > unclipped_loss.item()  # clipping only ever raises the loss


def test_padding_never_reaches_loss_or_gradient():
    vpreds, values, returns = _batch(3)
    v, mask = pad_rows(vpreds)
    old, ret = pad_rows(values)[0], pad_rows(returns)[0]
    v.requires_grad_(True)
    loss, metrics = value_loss(v, old, ret, mask, 0.2)
    loss.backward()
    grad = v.grad.clone()
    noisy_v = v.detach().clone()
    noisy_v[~mask] = float("nan")
    noisy_old, noisy_ret = old.clone(), ret.clone()
    noisy_old[~mask], noisy_ret[~mask] = 1e4, float("inf")
    noisy_v.requires_grad_(True)
    loss2, metrics2 = value_loss(noisy_v, noisy_old, noisy_ret, mask, 0.2)
    loss2.backward()
    assert loss2.item() == loss.item() and metrics2 == metrics
    assert torch.equal(noisy_v.grad, grad) and torch.equal(grad[~mask], torch.zeros(int((~mask).sum())))


def test_lists_of_rows_equal_padded():
    vpreds, values, returns = _batch(4)
    v, mask = pad_rows(vpreds)
    padded = value_loss(v, pad_rows(values)[0], pad_rows(returns)[0], mask, 0.3)
    listed = value_loss(vpreds, values, returns, None, 0.3)
    assert listed[0].item() == pytest.approx(padded[0].item()) and listed[1] == pytest.approx(padded[1])
    with pytest.raises(ValueError):
        value_loss(v, v, v, None, 0.3)


@pytest.mark.parametrize("token_level", [True, False])
def test_gradient_contract_pieces_sum_to_the_batch_mean(token_level):
    """Summing the pieces' loss sums and dividing by the batch's token (or row) count gives the gradient of
    the whole batch's mean loss, whatever the split."""
    vpreds, values, returns = _batch(5)
    c = 0.25
    count = sum(LENGTHS) if token_level else len(LENGTHS)

    def grads(pieces):
        leaves = [p.clone().requires_grad_(True) for p in vpreds]
        total = 0.0
        for piece in pieces:
            loss, _ = value_loss([leaves[i] for i in piece], [values[i] for i in piece],
                                 [returns[i] for i in piece], None, c, token_level=token_level)
            (loss / count).backward()
            total += loss.item()
        return total / count, [leaf.grad for leaf in leaves]

    whole, g_whole = grads([[0, 1, 2, 3]])
    split, g_split = grads([[2], [0, 3], [1]])
    assert split == pytest.approx(whole, rel=1e-6)
    for a, b in zip(g_whole, g_split):
        torch.testing.assert_close(a, b)
    # the mean itself, computed directly
    per = []
    for v, o, r in zip(vpreds, values, returns):
        clipped = o + (v - o).clamp(-c, c)
        per.append(0.5 * torch.maximum((v - r).square(), (clipped - r).square()))
    direct = torch.cat(per).mean() if token_level else torch.stack([p.mean() for p in per]).mean()
    assert whole == pytest.approx(float(direct), rel=1e-6)


def test_sequence_level_weighs_rows_equally():
    vpreds = [torch.zeros(1), torch.zeros(4)]
    returns = [torch.ones(1), torch.full((4,), 2.0)]
    loss, metrics = value_loss(vpreds, vpreds, returns, None, None, token_level=False)
    assert loss.item() == pytest.approx(0.5 * 1.0 + 0.5 * 4.0)  # one mean per row, summed
    assert metrics["critic/vf_loss"] == pytest.approx((0.5 + 2.0) / 2)
    token, token_metrics = value_loss(vpreds, vpreds, returns, None, None, token_level=True)
    assert token.item() == pytest.approx(0.5 * 1.0 + 4 * 0.5 * 4.0)
    assert token_metrics["critic/vf_loss"] == pytest.approx(8.5 / 5)
