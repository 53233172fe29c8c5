"""RayPPOTrainer: PPO with a critic (upstream's ``stage: ray_ppo``).

The loop is RayGRPOTrainer's: the run plan's stage table in order. For PPO
the plan holds the critic's rows: ``critic_compute_values`` (on the critic
group), ``compute_kl`` (use_kl_in_reward), ``compute_advantage`` (GAE, in the
driver) and ``critic_train`` before ``actor_train``; the critic's DP stages
are balanced like the actor's, with their own ``dp_balance/*`` records.
"""
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer


class RayPPOTrainer(RayGRPOTrainer):
    """Upstream's RayPPOTrainer name; takes RayGRPOTrainer's arguments plus ``critic_worker``."""

    def __init__(self, actor_worker, ref_worker=None, reward_list=None, critic_worker=None, **kwargs):
        if critic_worker is None:
            raise ValueError("RayPPOTrainer needs critic_worker: the critic's worker group (critic_config on "
                             "rl_config.critic_resource)")
        super().__init__(actor_worker, ref_worker, reward_list, critic_worker=critic_worker, **kwargs)
