"""Upstream's module path for the actor loss and GRPO's advantage; the functions live in mindspeed_rl.algorithms.

``grpo_loss`` is the actor loss (``algorithms.policy_loss.actor_loss``) under its old name: GRPO's, DAPO's
and PPO's actor loss alike, any registered loss_mode and loss_agg_mode."""
from mindspeed_rl.algorithms.grpo import compute_group_norm_advantages  # noqa: F401
from mindspeed_rl.algorithms.kl import KL_KINDS, kl_penalty  # noqa: F401
from mindspeed_rl.algorithms.policy_loss import actor_loss

grpo_loss = actor_loss
