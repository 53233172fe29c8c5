"""RayBaseTrainer: the driver-side state shared by RL trainers."""
from typing import List

from mindspeed_rl.trainer.utils.compute_utils import AdaptiveKLController, FixedKLController


class RayBaseTrainer:
    """Runs on the driver; decides the order of stages, never per-rank work.
    Row counts and stages come from ``run_plan`` (config_cls.RunPlan)."""

    def __init__(self, actor_worker=None, ref_worker=None, reward_list: List = None, run_plan=None, critic_worker=None,
                 adv_estimator: str = "group_norm", kl_ctrl_type: str = "fixed", kl_horizon: int = 1000,
                 kl_target: float = 100.0, init_kl_coef: float = 0.001,
                 dataset_additional_keys: List[str] = None, save_interval: int = 0, save_dir: str = None,
                 save_optimizer: bool = True, save_rng: bool = True):
        if run_plan is None:
            raise ValueError("RayBaseTrainer needs the run_plan (config_cls.RunPlan) of the run")
        self.actor_worker = actor_worker
        self.ref_worker = ref_worker
        self.critic_worker = critic_worker
        # the worker group of each role of the stage table
        self.groups = {"actor": actor_worker, "ref": ref_worker or actor_worker, "critic": critic_worker}
        for stage in run_plan.dp_stages:
            if self.groups.get(stage.role) is None:
                raise ValueError(f"stage '{stage.name}' of the run plan runs on role {stage.role!r}, but no worker "
                                 f"group was given for it (groups: "
                                 f"{sorted(k for k, v in self.groups.items() if v is not None)})")
        self.reward_list = reward_list or []
        self.run_plan = run_plan
        self.adv_estimator = adv_estimator
        self.dataset_additional_keys = dataset_additional_keys or []
        self.save_interval, self.save_dir = save_interval, save_dir
        self.save_optimizer, self.save_rng = save_optimizer, save_rng
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
