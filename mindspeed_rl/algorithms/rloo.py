"""RLOO: each row's score less the mean of the other rows of its group (leave-one-out baseline)."""
from typing import Optional, Tuple

from torch import Tensor

from mindspeed_rl.algorithms.outcome import group_scores, per_token
from mindspeed_rl.algorithms.registry import register_adv_est


def rloo_advantages(token_level_rewards: Tensor, response_mask: Tensor, n_samples: int, spec,
                    values: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """A_i = r_i - mean of r_j (j != i) in the group; a group of one keeps its score (no baseline)."""
    scores = group_scores(token_level_rewards, response_mask, n_samples)
    if n_samples == 1:
        adv = scores
    else:
        adv = scores - (scores.sum(dim=1, keepdim=True) - scores) / (n_samples - 1)
    adv = per_token(adv.reshape(-1), response_mask)
    return adv, adv


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_adv_est("rloo", title="RLOO")(rloo_advantages)
