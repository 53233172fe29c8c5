"""What an algorithm is, as plain functions registered by name: advantage estimators (rl_config.adv_estimator),
policy losses (rl_config.loss_mode) with loss aggregation (rl_config.loss_agg_mode), driver stage functions.

Importing the package registers the built-in ones. Pure tensors in and out; nothing distributed here.
"""
from mindspeed_rl.algorithms import cispo, gae, grpo, gspo, ppo_clip, reinforce_plus_plus, rloo  # noqa: F401
from mindspeed_rl.algorithms.registry import (ADV_ESTIMATORS, DRIVER_STAGES, POLICY_LOSSES,  # noqa: F401
                                              get_adv_estimator_fn, get_policy_loss_fn, register_adv_est,
                                              register_policy_loss, register_stage)
