"""REINFORCE++: discounted returns whitened over the batch; the baseline variant takes the group mean off."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from mindspeed_rl.algorithms.masked import masked_whiten
from mindspeed_rl.algorithms.outcome import group_scores, per_token
from mindspeed_rl.algorithms.registry import register_adv_est


def discounted_returns(token_level_rewards: Tensor, response_mask: Tensor, gamma: float) -> Tensor:
    """G_t = r_t + gamma * G_{t+1} over each row's response tokens (0 after the last one and on padding)."""
    on = response_mask.bool()
    rewards = token_level_rewards.float()  # read only where the mask is set
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], device=rewards.device)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = torch.where(on[:, t], rewards[:, t] + gamma * running, 0.0)
        returns[:, t] = running
    return returns


def reinforce_plus_plus_advantages(token_level_rewards: Tensor, response_mask: Tensor, n_samples: int, spec,
                                   values: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Returns with discount ``spec.gamma``, whitened over every response token of the batch."""
    returns = discounted_returns(token_level_rewards, response_mask, spec.gamma)
    return masked_whiten(returns, response_mask), returns


def reinforce_plus_plus_baseline_advantages(token_level_rewards: Tensor, response_mask: Tensor, n_samples: int,
                                            spec, values: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """Score less its group's mean (a group of one: no baseline), on every token, whitened over the batch."""
    scores = group_scores(token_level_rewards, response_mask, n_samples)
    centred = scores - scores.mean(dim=1, keepdim=True) if n_samples > 1 else scores
    adv = masked_whiten(per_token(centred.reshape(-1), response_mask), response_mask)
    return adv, adv


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_adv_est("reinforce_plus_plus", title="REINFORCE++")(reinforce_plus_plus_advantages)
register_adv_est("reinforce_plus_plus_baseline", title="REINFORCE++-baseline")(
    reinforce_plus_plus_baseline_advantages)
