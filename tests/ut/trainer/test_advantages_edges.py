"""PPO advantage helpers at their edges: empty batches, dtypes kept or fixed, one- and two-token
statistics, a constant batch whitened, an explicit mask with lists of rows, the KL defaults and
switches of token_level_rewards, and what each refusal says."""
import re

import pytest
import torch

from mindspeed_rl.trainer.utils.advantages import (compute_gae_advantage_return, kl_in_reward, masked_mean,
                                                   masked_var, masked_whiten, pad_rows, token_level_rewards)
from mindspeed_rl.data.columnar import row_views, unpadded_rows


def test_pad_rows_of_nothing():
    padded, mask = pad_rows([])
    assert padded.shape == (0, 0) and padded.dtype == torch.float32 and mask.shape == (0, 0)


def test_pad_rows_keeps_the_rows_dtype_unless_told():
    padded, _ = pad_rows([torch.tensor([1, 2]), torch.tensor([3])])
    assert padded.dtype == torch.long and padded.tolist() == [[1, 2], [3, 0]]
    padded, _ = pad_rows([torch.tensor([7])])
    assert padded.dtype == torch.long and padded.tolist() == [[7]]
    padded, _ = pad_rows([torch.tensor([1, 2])], pad_value=-1.0, dtype=torch.float64)
    assert padded.dtype == torch.float64


def test_unpadded_rows_counts_rows_not_columns():
    padded = torch.arange(6.0).reshape(2, 3)
    assert [r.tolist() for r in row_views(*unpadded_rows(padded, torch.tensor([1, 3])))] == [[0.0], [3.0, 4.0, 5.0]]
    with pytest.raises(ValueError, match=r"^3 lengths for 2 rows$"):
        unpadded_rows(padded, [1, 1, 1])


def test_masked_stats_of_one_and_two_tokens():
    x = torch.tensor([[4.0, 1.0, 3.0]])
    assert float(masked_mean(x, torch.tensor([[0, 0, 1]]))) == 3.0
    assert masked_mean(x, torch.tensor([[1, 0, 0]]), dim=1).tolist() == [4.0]
    assert float(masked_var(x, torch.tensor([[0, 1, 1]]))) == pytest.approx(2.0)  # unbiased: 2 / (2 - 1)
    assert float(masked_var(x, torch.tensor([[0, 1, 1]]), unbiased=False)) == pytest.approx(1.0)


def test_whitening_a_constant_batch_gives_zeros():
    out = masked_whiten(torch.full((2, 3), 5.0), torch.tensor([[1, 1, 0], [1, 0, 0]]))
    assert torch.equal(out, torch.zeros(2, 3))


def test_gae_lists_of_rows_take_an_explicit_mask():
    rewards = [torch.tensor([0.3, 5.0, -0.2, 1.0])]
    values = [torch.tensor([0.1, 9.0, 0.4, 0.2])]
    mask = torch.tensor([[1, 0, 1, 1]])
    listed = compute_gae_advantage_return(rewards, values, mask, 0.9, 0.8)
    padded = compute_gae_advantage_return(torch.stack(rewards), torch.stack(values), mask, 0.9, 0.8)
    for a, b in zip(listed, padded):
        torch.testing.assert_close(a, b)
    assert float(listed[1][0, 1]) == 0.0


def test_gae_refusals_say_why():
    with pytest.raises(ValueError, match=r"^response_mask is needed with padded tensors$"):
        compute_gae_advantage_return(torch.zeros(1, 2), torch.zeros(1, 2), None, 1.0, 1.0)
    with pytest.raises(ValueError, match=re.escape("shapes differ: rewards (2, 3), values (2, 4), mask (2, 3)")):
        compute_gae_advantage_return(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 1.0)


def test_kl_in_reward_defaults_to_the_plain_log_ratio():
    old, ref = torch.tensor([[0.5, -1.0]]), torch.tensor([[0.25, 0.0]])
    assert kl_in_reward(old, ref).tolist() == [[0.25, -1.0]]  # kind "kl", no mask
    assert [r.tolist() for r in kl_in_reward([old[0]], [ref[0]])] == [[0.25, -1.0]]
    with pytest.raises(ValueError, match=r"^1 rows of log-probs but 2 of reference$"):
        kl_in_reward([old[0]], [ref[0], ref[0]])


def test_token_level_rewards_kl_switches():
    kl = torch.tensor([[0.5, 0.5], [1.0, 1.0]])
    plain, mask = token_level_rewards([2.0, 3.0], [2, 1], kl)  # kl_coef defaults to 0: kl unused
    assert plain.tolist() == [[0.0, 2.0], [3.0, 0.0]] and mask.tolist() == [[True, True], [True, False]]
    one, _ = token_level_rewards([2.0, 3.0], [2, 1], kl, kl_coef=1.0)
    assert one.tolist() == [[-0.5, 1.5], [2.0, 0.0]]
    none, _ = token_level_rewards([2.0, 3.0], [2, 1], None, kl_coef=0.1)  # a coefficient without kl: no KL
    assert none.tolist() == [[0.0, 2.0], [3.0, 0.0]]


def test_token_level_rewards_are_float32_and_may_be_empty():
    rewards, _ = token_level_rewards(torch.tensor([1.5], dtype=torch.float64), torch.tensor([1]))
    assert rewards.dtype == torch.float32 and rewards.tolist() == [[1.5]]
    rewards, mask = token_level_rewards([], [])
    assert rewards.shape == (0, 0) and mask.shape == (0, 0)


def test_token_level_rewards_refusals_say_why():
    with pytest.raises(ValueError, match=r"^3 scores for 2 response lengths$"):
        token_level_rewards(torch.zeros(3), [1, 2])
    with pytest.raises(ValueError, match=re.escape("kl of shape (2, 1) does not cover 2 rows of up to 2 tokens")):
        token_level_rewards([1.0, 1.0], [2, 1], torch.zeros(2, 1))  # rows right, too narrow
