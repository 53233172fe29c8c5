"""Driver-side stages that run on the whole batch: rewards, advantages, data metrics.

``td`` is the trainer's ``DriverDock`` (called in-process). Upstream's stages
over a dock actor (``compute_rule_reward``, ``compute_advantage``, ...) are in
``mindspeed_rl.compat.compute_utils`` and still import from here."""
from typing import Dict, Sequence, Tuple, Union

import numpy as np
import torch

from mindspeed_rl.models.loss.grpo_loss import compute_group_norm_advantages
from mindspeed_rl.trainer.utils.columnar import ColumnBatch, FlatRows, value_rows


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


def overlong_penalty(response_length: torch.Tensor, buffer: int, penalty_factor: float,
                     max_tokens: int) -> torch.Tensor:
    """DAPO's soft overlong punishment per row: 0 up to ``max_tokens - buffer`` tokens,
    then falling linearly to ``-penalty_factor`` at ``max_tokens`` (and no lower)."""
    over = response_length.float() - (max_tokens - buffer)
    return -(over.clamp(min=0.0, max=float(buffer)) / buffer) * penalty_factor


def verifier_scores(reward_list: Sequence, name: str) -> torch.Tensor:
    """The last per-row scores of verifier ``name`` (before its weight), from the reward functions."""
    for reward_fn in reward_list:
        scores = (getattr(reward_fn, "last_scores", None) or {}).get(name)
        if scores is not None:
            return torch.as_tensor(scores).float().reshape(-1)
    raise ValueError(f"rl_config.filter_groups_metric={name!r}: no reward function gave per-row scores "
                     f"under that name")


def score_rows(reward_list: Sequence, responses, labels) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Scores of every row: each reward function's scores times its ``weight``
    (attribute, default 1), summed; plus the functions' own metrics."""
    if not reward_list:
        raise ValueError("no reward function: give at least one (rl_config.verifier_function)")
    total, metrics = None, {}
    for reward_fn in reward_list:
        scores = torch.as_tensor(reward_fn(responses, labels)).float().reshape(-1)
        if scores.numel() != len(responses):
            raise ValueError(f"reward {type(reward_fn).__name__} gave {scores.numel()} scores for "
                             f"{len(responses)} responses")
        weighted = scores * float(getattr(reward_fn, "weight", 1.0))
        total = weighted if total is None else total + weighted
        metrics.update(getattr(reward_fn, "last_metrics", {}) or {})
    return total, metrics


def reward_stats(scores: torch.Tensor) -> Dict[str, float]:
    return {"reward/mean": float(scores.mean()), "reward/max": float(scores.max()), "reward/min": float(scores.min())}


def data_metrics(batch) -> Dict[str, float]:
    resp = np.array([int(x) for x in batch["response_length"]], dtype=np.float64)
    prompt = np.array([int(x) for x in batch["prompt_length"]], dtype=np.float64)
    return {"response_length/mean": resp.mean(), "response_length/max": resp.max(),
            "response_length/min": resp.min(), "prompt_length/mean": prompt.mean()}


def compute_rewards(td, stage, reward_list: Sequence, overlong=None, filter_metric: str = None) -> Dict[str, float]:
    """The reward stage of a round: one fetch of every row in order, scores
    (weighted over ``reward_list``, plus DAPO's overlong penalty with an
    ``overlong`` spec) and data metrics, one put of ``stage.outputs`` (rm_scores,
    and with dynamic sampling the ``filter_metric`` verifier's own scores)."""
    rows = list(range(stage.rows_per_share))
    batch = td.get_rows(list(stage.inputs), rows)
    scores, metrics = score_rows(reward_list, batch["responses"], batch["labels"])
    if overlong is not None:
        lengths = torch.tensor([int(x) for x in batch["response_length"]])
        penalty = overlong_penalty(lengths, overlong.buffer, overlong.penalty_factor, overlong.max_tokens)
        scores = scores + penalty
        metrics.update({"reward/overlong_penalty/mean": float(penalty.mean()),
                        "reward/overlong_penalty/frac": float((penalty < 0).float().mean())})
    bad = torch.nonzero(~torch.isfinite(scores)).reshape(-1)
    if bad.numel():  # named by the trainer's non-finite policy (rl_config.max_nonfinite_iterations)
        metrics.update({"reward/nonfinite": float(bad.numel()), "reward/first_nonfinite_row": float(bad[0]),
                        "reward/first_nonfinite_value": float(scores[bad[0]])})
    values = (scores,) + ((verifier_scores(reward_list, filter_metric),) if filter_metric else ())
    if len(values) != len(stage.outputs):
        raise ValueError(f"stage '{stage.name}' writes {list(stage.outputs)}; got {len(values)} columns "
                         f"(filter_metric={filter_metric!r})")
    put_columns(td, dict(zip(stage.outputs, values)), rows)
    metrics.update(reward_stats(scores))
    metrics.update(data_metrics(batch))
    return metrics


def put_columns(td, columns: Dict[str, Union[torch.Tensor, FlatRows]], rows) -> None:
    """One put, one buffer per column: a (rows,) tensor is one number per row, a FlatRows (e.g.
    ``unpadded_rows`` of a padded result) is taken as it is; no per-row tensors are made."""
    flat = {k: value_rows(v) if isinstance(v, torch.Tensor) else v for k, v in columns.items()}
    td.put_experience(ColumnBatch(flat=flat), rows)


def advantage_stats(advantages: torch.Tensor) -> Dict[str, float]:
    """Mean, std and the fraction of exact zeros over every advantage value of the round (one tensor)."""
    flat = advantages.reshape(-1).float()
    return {"advantages/mean": float(flat.mean()), "advantages/std": float(flat.std()) if flat.numel() > 1 else 0.0,
            "advantages/zero_frac": float((flat == 0).float().mean())}


def compute_group_advantages(td, stage, n_samples: int) -> Dict[str, float]:
    """GRPO/DAPO advantage stage: rm_scores normalised within each group of ``n_samples`` rows."""
    rows = list(range(stage.rows_per_share))
    scores = torch.cat([s.reshape(1).float() for s in td.get_rows(["rm_scores"], rows)["rm_scores"]])
    advantages = compute_group_norm_advantages(scores, n_samples)
    put_columns(td, {stage.outputs[0]: advantages}, rows)
    return advantage_stats(advantages)


def __getattr__(name: str):
    # upstream's stages over a whole dock and dock_call, by their old path (imported on first use:
    # mindspeed_rl.compat imports this module)
    from mindspeed_rl.compat import compute_utils as upstream
    if name in upstream.__all__:
        return getattr(upstream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
