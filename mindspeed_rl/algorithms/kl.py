"""Per-token KL estimates between the policy and the reference, from the sampled tokens' log-probs, and the
controllers of the KL coefficient (rl_config.kl_ctrl_type)."""
import numpy as np
import torch

KL_KINDS = ("kl", "abs", "mse", "low_var_kl")


def kl_penalty(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    """kl: logp - ref; abs: |logp - ref|; mse: 0.5 (logp - ref)^2;
    low_var_kl: k3 = exp(ref - logp) - (ref - logp) - 1, the log-ratio clamped to [-20, 20]
    before exp for stability and the result clamped to [-10, 10]."""
    if kind == "kl":
        return log_probs - ref_log_probs
    if kind == "abs":
        return (log_probs - ref_log_probs).abs()
    if kind == "mse":
        return 0.5 * (log_probs - ref_log_probs).square()
    if kind == "low_var_kl":
        log_ratio = torch.clamp(ref_log_probs - log_probs, min=-20.0, max=20.0)
        k3 = torch.exp(log_ratio) - log_ratio - 1.0
        return torch.clamp(k3, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl kind {kind!r}; known: {list(KL_KINDS)}")


class FixedKLController:
    def __init__(self, init_kl_coef: float):
        self.value = init_kl_coef

    def update(self, current_kl: float, n_steps: int):
        pass


class AdaptiveKLController:
    """Proportional control of the KL coefficient towards ``target_kl``."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if horizon <= 0:
            raise ValueError(f"kl_horizon must be positive, got {horizon}")
        self.value, self.target, self.horizon = init_kl_coef, target_kl, horizon

    def update(self, current_kl: float, n_steps: int):
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value = max(0.0, self.value * (1 + error * n_steps / self.horizon))
