"""DAPO's loss switches, overlong penalty and group filter on hand-computed tensors."""
import pytest
import torch

from mindspeed_rl.models.loss.grpo_loss import grpo_loss
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics
from mindspeed_rl.trainer.dynamic_sampling import kept_groups
from mindspeed_rl.trainer.utils.compute_utils import overlong_penalty


def _two_sequences():
    # sequence 0: 1 token, advantage +1; sequence 1: 3 tokens, advantage -1; on-policy (ratio 1)
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    lp = torch.zeros(2, 3)
    return lp, torch.tensor([1.0, -1.0]), mask


def test_token_mean_and_sample_mean():
    lp, adv, mask = _two_sequences()
    # per token loss is -A: token mean (-1 + 1 + 1 + 1) / 4 = 0.5
    token, _ = grpo_loss(lp, lp, adv, mask, token_level_loss=True)
    assert token.item() == pytest.approx(0.5)
    # sample mean: each sequence's token mean (-1 and +1), then their mean = 0
    sample, _ = grpo_loss(lp, lp, adv, mask, token_level_loss=False)
    assert sample.item() == pytest.approx(0.0, abs=1e-6)
    # a caller splitting the mini-batch passes the sequence count: sum of sequence means / 4 sequences
    part, _ = grpo_loss(lp[1:], lp[1:], adv[1:], mask[1:], token_level_loss=False, token_count=4)
    assert part.item() == pytest.approx(1.0 / 4)


def test_asymmetric_clip_at_both_ends():
    # ratios 1.5 (A>0), 1.25 (A>0), 1.4 (A>0), 0.5 (A<0), 0.9 (A<0)
    ratio = torch.tensor([[1.5, 1.25, 1.4, 0.5, 0.9]])
    old = torch.zeros(1, 5)
    lp = ratio.log()
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 5)
    loss, m = grpo_loss(lp, old, adv, mask, clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28)
    # 1.5 and 1.4 -> 1.28; 1.25 unclipped; 0.5 -> 0.8 (+0.8); 0.9 unclipped (+0.9)
    assert loss.item() == pytest.approx((-1.28 - 1.25 - 1.28 + 0.8 + 0.9) / 5, abs=1e-6)
    assert m["actor/clip_frac_high"] == pytest.approx(0.4)
    assert m["actor/clip_frac_low"] == pytest.approx(0.2)
    assert m["actor/clip_frac"] == pytest.approx(0.6)
    # symmetric 0.2 clips 1.25 too
    sym, m = grpo_loss(lp, old, adv, mask, clip_ratio=0.2)
    assert sym.item() == pytest.approx((-1.2 - 1.2 - 1.2 + 0.8 + 0.9) / 5, abs=1e-6)
    assert m["actor/clip_frac_high"] == pytest.approx(0.6)


def test_overlong_penalty_ramp():
    # max 10 tokens, buffer 4: free up to 6 tokens, then -factor * (len - 6) / 4, at most -factor
    lengths = torch.tensor([3, 6, 7, 8, 9, 10])
    got = overlong_penalty(lengths, buffer=4, penalty_factor=0.5, max_tokens=10)
    assert torch.allclose(got, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.375, -0.5]))


def test_groups_with_equal_metric_are_dropped():
    metric = torch.tensor([1.0, 1, 1, 0, 1, 0, 0.0, 0, 0])
    assert kept_groups(metric, 3).tolist() == [1]
    assert kept_groups(metric, 1).tolist() == list(range(9))  # one sample per prompt: all kept


def test_rollout_metrics_merge():
    merged = merge_rollout_metrics([{"reward/mean": 1.0, "reward/max": 2.0, "reward/min": 0.0},
                                    {"reward/mean": 3.0, "reward/max": 5.0, "reward/min": -1.0}])
    assert merged == {"reward/mean": 2.0, "reward/max": 5.0, "reward/min": -1.0}
