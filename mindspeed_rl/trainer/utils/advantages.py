"""The old path of PPO's advantage math; it lives in mindspeed_rl.algorithms (masked.py, gae.py)."""
from mindspeed_rl.algorithms.gae import (compute_gae_advantage_return, kl_in_reward,  # noqa: F401
                                         token_level_rewards)
from mindspeed_rl.algorithms.masked import (WHITEN_EPS, masked_mean, masked_var, masked_whiten,  # noqa: F401
                                            pad_rows)
