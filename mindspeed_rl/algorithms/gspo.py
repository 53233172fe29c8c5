"""GSPO: one importance ratio per sequence (the geometric mean of its tokens' ratios), clipped per sequence."""
from typing import Tuple

import torch
from torch import Tensor

from mindspeed_rl.algorithms.registry import register_policy_loss

MAX_LOG_RATIO = 10.0  # exp() overflow guard on the sequence log-ratio


def gspo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor,
              clip_low: float, clip_high: float) -> Tuple[Tensor, Tensor]:
    """s_i = exp(mean over the row's kept tokens of (logp - old_logp)); per token
    max(-A s_i, -A clip(s_i, 1 - low, 1 + high)), where each token's gradient is that of its own log-prob
    scaled by s_i (s_i's value, logp's gradient)."""
    count = mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    seq_log_ratio = torch.where(mask > 0, (log_probs - old_log_probs) * mask, 0.0).sum(dim=-1, keepdim=True) / count
    log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach()
    ratio = torch.exp(torch.clamp(log_ratio, max=MAX_LOG_RATIO))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_policy_loss("gspo", title="GSPO")(gspo_loss)
