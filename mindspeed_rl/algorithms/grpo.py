"""GRPO's advantage: each row's score less its group's mean, over the group's std (Dr.GRPO: no std)."""
from typing import Optional, Tuple

import torch
from torch import Tensor

from mindspeed_rl.algorithms.outcome import group_scores, per_token
from mindspeed_rl.algorithms.registry import register_adv_est


def compute_group_norm_advantages(rewards: Tensor, n_samples: int, eps: float = 1e-6,
                                  norm_by_std: bool = True) -> Tensor:
    """(r - group mean) / (group std + eps) over groups of n_samples consecutive rows; without
    ``norm_by_std`` only the mean is taken off (Dr.GRPO).

    The std is the unbiased (Bessel-corrected) one, torch.std's default, as upstream uses.
    A group whose rewards are all equal, and any group of size 1, gets advantage 0.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    if rewards.numel() % n_samples != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {n_samples}")
    scores = rewards.float().view(-1, n_samples)
    centred = scores - scores.mean(dim=1, keepdim=True)
    if n_samples == 1 or not norm_by_std:
        return centred.view(-1)  # one sample: all zeros (the unbiased std is undefined)
    std = scores.std(dim=1, keepdim=True)
    return (centred / (std + eps)).view(-1)


def grpo_advantages(token_level_rewards: Tensor, response_mask: Tensor, n_samples: int, spec,
                    values: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """GRPO (rl_config.norm_adv_by_std_in_grpo=false: Dr.GRPO) on every response token of a row."""
    scores = group_scores(token_level_rewards, response_mask, n_samples).reshape(-1)
    adv = per_token(compute_group_norm_advantages(scores, n_samples, spec.eps, spec.norm_adv_by_std_in_grpo),
                    response_mask)
    return adv, adv


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_adv_est("group_norm", aliases=("grpo",))(grpo_advantages)
