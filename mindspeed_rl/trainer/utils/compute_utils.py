"""Driver-side stages that run on the whole batch: rewards, advantages, data metrics."""
from typing import Dict

import numpy as np
import ray
import torch

from mindspeed_rl.models.loss.grpo_loss import compute_group_norm_advantages
from mindspeed_rl.trainer.utils.columnar import ColumnBatch


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


def compute_rule_reward(td, reward_fn, total_rows: int) -> Dict[str, float]:
    """Score every response with ``reward_fn(responses, labels)`` into ``rm_scores``."""
    batch, index = ray.get(td.get_experience.remote("rule_reward", ["responses", "labels"], total_rows))
    if batch is None:
        raise RuntimeError("rule reward: responses or labels are missing for part of the batch")
    scores = reward_fn(batch["responses"], batch["labels"])
    ray.get(td.put_experience.remote(ColumnBatch({"rm_scores": [s.reshape(1) for s in scores.float()]}), index))
    metrics = dict(getattr(reward_fn, "last_metrics", {}) or {})
    metrics.update({"reward/mean": float(scores.mean()), "reward/max": float(scores.max()),
                    "reward/min": float(scores.min())})
    return metrics


def compute_advantage(td, n_samples: int, total_rows: int, adv_estimator: str = "group_norm") -> None:
    """Group-normalised advantages from ``rm_scores`` (whole GRPO groups)."""
    if adv_estimator != "group_norm":
        raise ValueError(f"adv_estimator '{adv_estimator}' is not supported; use 'group_norm'")
    batch, index = ray.get(td.get_experience.remote("compute_advantage", ["rm_scores"], total_rows))
    if batch is None:
        raise RuntimeError("compute advantage: rm_scores are missing for part of the batch")
    scores = torch.cat([s.reshape(1).float() for s in batch["rm_scores"]])
    order = torch.as_tensor(index).argsort()  # rows back in group order
    adv = torch.empty_like(scores)
    adv[order] = compute_group_norm_advantages(scores[order], n_samples)
    ray.get(td.put_experience.remote(ColumnBatch({"advantages": [a.reshape(1) for a in adv]}), index))


def compute_grpo_data_metrics(td, total_rows: int) -> Dict[str, float]:
    batch, _ = ray.get(td.get_experience.remote("grpo_metrics", ["prompt_length", "response_length"], total_rows))
    if batch is None:
        return {}
    resp = np.array([int(x) for x in batch["response_length"]], dtype=np.float64)
    prompt = np.array([int(x) for x in batch["prompt_length"]], dtype=np.float64)
    return {"response_length/mean": resp.mean(), "response_length/max": resp.max(),
            "response_length/min": resp.min(), "prompt_length/mean": prompt.mean()}


def get_last_reward(rm_scores: torch.Tensor, n_sample_batch: int) -> torch.Tensor:
    """Upstream's name for group-normalised rewards: ``rm_scores`` in groups of
    ``n_sample_batch`` consecutive rows, same shape out."""
    flat = compute_group_norm_advantages(rm_scores.reshape(-1), n_sample_batch, eps=1e-8)
    return flat.reshape(rm_scores.shape)
