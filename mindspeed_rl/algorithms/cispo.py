"""CISPO: the importance ratio clipped and detached, weighting a REINFORCE term, so no token loses its gradient."""
from typing import Tuple

import torch
from torch import Tensor

from mindspeed_rl.algorithms.registry import register_policy_loss


def cispo_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, mask: Tensor,
               clip_low: float, clip_high: float) -> Tuple[Tensor, Tensor]:
    """-sg(clip(r, 1 - low, 1 + high)) * A * logp per token; ``clipped``: r outside the bounds."""
    ratio = torch.exp(log_probs - old_log_probs).detach()
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -weight * advantages * log_probs, weight != ratio


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_policy_loss("cispo", title="CISPO")(cispo_loss)
