"""Outcome rewards: one score per row, grouped by prompt (n_samples consecutive rows), and back to tokens."""
import torch
from torch import Tensor


def group_scores(token_level_rewards: Tensor, response_mask: Tensor, n_samples: int) -> Tensor:
    """(groups, n_samples) float32: each row's reward summed over its response tokens."""
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if token_level_rewards.dim() != 2 or response_mask.shape != token_level_rewards.shape:
        raise ValueError(f"token_level_rewards {tuple(token_level_rewards.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} must be the same (rows, tokens) shape")
    rows = token_level_rewards.shape[0]
    if rows % n_samples:
        raise ValueError(f"{rows} rows do not split into groups of {n_samples}")
    scores = torch.where(response_mask.bool(), token_level_rewards.float(), 0.0).sum(dim=-1)
    return scores.view(-1, n_samples)


def per_token(row_values: Tensor, response_mask: Tensor) -> Tensor:
    """(rows, tokens): each row's value on its response tokens, 0 elsewhere."""
    return torch.where(response_mask.bool(), row_values.reshape(-1, 1).float(), 0.0)
