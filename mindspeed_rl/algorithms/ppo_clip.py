"""PPO's clipped surrogate per token (verl's loss_mode 'vanilla'; DAPO's clip-higher through the bounds)."""
from typing import Tuple

import torch
from torch import Tensor

from mindspeed_rl.algorithms.registry import register_policy_loss


def ppo_clip_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor,
                  clip_low: float, clip_high: float) -> Tuple[Tensor, Tensor]:
    """max(-A r, -A clip(r, 1 - low, 1 + high)) with r = exp(logp - old_logp); (loss, clipped) per token."""
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_policy_loss("vanilla")(ppo_clip_loss)
