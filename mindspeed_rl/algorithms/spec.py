"""The plain settings an algorithm's functions read, decided once by the run plan."""
from dataclasses import dataclass

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class AdvantageSpec:
    """rl_config.adv_estimator and what estimators read: PPO's GAE (gamma, lam), REINFORCE++'s discount
    (gamma), GRPO's std scaling (norm_adv_by_std_in_grpo=False: Dr.GRPO), and where PPO's KL goes."""
    gamma: float = 1.0
    lam: float = 1.0
    kl_in_reward: bool = False     # PPO use_kl_in_reward
    kl_penalty: str = "low_var_kl"
    name: str = "group_norm"       # registered name (an alias resolved: grpo -> group_norm)
    norm_adv_by_std_in_grpo: bool = True
    eps: float = 1e-6
    critic: bool = False           # the estimator reads a critic's values
