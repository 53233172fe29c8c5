"""RayBaseTrainer: the driver-side state shared by RL trainers."""
from typing import List

from mindspeed_rl.trainer.utils.compute_utils import AdaptiveKLController, FixedKLController


class RayBaseTrainer:
    """Runs on the driver; decides the order of stages, never per-rank work."""

    def __init__(self, actor_worker=None, ref_worker=None, reward_list: List = None, train_iters: int = 1,
                 save_interval: int = 1, gamma: float = 1.0, lam: float = 0.95, adv_estimator: str = "group_norm",
                 missing_eos_penalty: float = 1.0, kl_penalty: str = "low_var_kl", kl_ctrl_type: str = "fixed",
                 kl_horizon: int = 1000, kl_target: float = 100.0, init_kl_coef: float = 0.001,
                 global_batch_size: int = 32, micro_batch_size: int = 1, n_samples_per_prompt: int = 1,
                 tokenizer=None, dataset_additional_keys: List[str] = None, blocking: bool = False,
                 guarantee_order: bool = False, use_dp_batch_balance: bool = False,
                 num_cpus_for_local_task: float = 0.1, **kwargs):
        self.actor_worker = actor_worker
        self.ref_worker = ref_worker
        self.reward_list = reward_list or []
        self.train_iters = train_iters
        self.save_interval = save_interval
        self.gamma, self.lam = gamma, lam
        self.adv_estimator = adv_estimator
        self.missing_eos_penalty = missing_eos_penalty
        self.kl_penalty = kl_penalty
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.n_samples_per_prompt = n_samples_per_prompt
        self.tokenizer = tokenizer
        self.dataset_additional_keys = dataset_additional_keys or []
        self.blocking = blocking
        self.guarantee_order = guarantee_order
        self.use_dp_batch_balance = use_dp_batch_balance
        self.num_cpus_for_local_task = num_cpus_for_local_task
        self.kwargs = kwargs
        if kl_ctrl_type == "fixed":
            self.kl_ctrl = FixedKLController(init_kl_coef)
        elif kl_ctrl_type == "adaptive":
            self.kl_ctrl = AdaptiveKLController(init_kl_coef, kl_target, kl_horizon)
        else:
            raise ValueError(f"kl_ctrl_type must be 'fixed' or 'adaptive', got {kl_ctrl_type!r}")

    def transfer_dock_init(self):
        raise NotImplementedError

    def fit(self, data_iters):
        raise NotImplementedError
