"""Upstream's reward and advantage stages, one call each over a whole dock.

``td`` is a ``GRPOTransferDock`` actor handle (or a dock object, called
in-process). Our trainer runs its own driver stages instead (trainer/driver_stages.py)."""
from typing import Dict

import ray
import torch

from mindspeed_rl.algorithms.grpo import compute_group_norm_advantages
from mindspeed_rl.data.columnar import ColumnBatch, value_rows
from mindspeed_rl.trainer.utils.reward_stage import data_metrics, reward_stats, score_rows

__all__ = ["compute_advantage", "compute_grpo_data_metrics", "compute_rule_reward", "dock_call", "get_last_reward"]


def dock_call(td, method: str, *args):
    """``td.method(*args)`` on a dock object, or its result on an actor handle."""
    fn = getattr(td, method)
    return ray.get(fn.remote(*args)) if hasattr(fn, "remote") else fn(*args)


def compute_rule_reward(td, reward_fn, total_rows: int) -> Dict[str, float]:
    """Upstream's reward stage alone: score every row with ``reward_fn(responses, labels)`` into ``rm_scores``."""
    rows = list(range(total_rows))
    batch = dock_call(td, "get_rows", ["responses", "labels"], rows)
    scores, metrics = score_rows([reward_fn], batch["responses"], batch["labels"])
    dock_call(td, "put_experience", ColumnBatch(flat={"rm_scores": value_rows(scores)}), rows)
    metrics.update(reward_stats(scores))
    return metrics


def compute_advantage(td, n_samples: int, total_rows: int, adv_estimator: str = "group_norm") -> None:
    """Upstream's advantage stage alone: group-normalised advantages from ``rm_scores``."""
    if adv_estimator != "group_norm":
        raise ValueError(f"adv_estimator '{adv_estimator}' is not supported; use 'group_norm'")
    rows = list(range(total_rows))
    batch = dock_call(td, "get_rows", ["rm_scores"], rows)
    scores = torch.cat([s.reshape(1).float() for s in batch["rm_scores"]])
    adv = compute_group_norm_advantages(scores, n_samples)
    dock_call(td, "put_experience", ColumnBatch(flat={"advantages": value_rows(adv)}), rows)


def get_last_reward(rm_scores: torch.Tensor, n_sample_batch: int) -> torch.Tensor:
    """Upstream's name for group-normalised rewards: ``rm_scores`` in groups of
    ``n_sample_batch`` consecutive rows, same shape out."""
    flat = compute_group_norm_advantages(rm_scores.reshape(-1), n_sample_batch, eps=1e-8)
    return flat.reshape(rm_scores.shape)


def compute_grpo_data_metrics(td, total_rows: int) -> Dict[str, float]:
    """Upstream's name: length metrics of the round's ``total_rows`` rows."""
    batch = dock_call(td, "get_rows", ["prompt_length", "response_length"], list(range(total_rows)))
    return data_metrics(batch)
