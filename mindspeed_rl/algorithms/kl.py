"""Per-token KL estimates between the policy and the reference, from the sampled tokens' log-probs."""
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
