"""The reward stage on the whole round: weighted verifier scores, DAPO's overlong penalty and filter metric,
data and advantage metrics. ``td`` is the trainer's ``DriverDock`` (called in-process); upstream's stages over
a dock actor are in ``mindspeed_rl.compat.compute_utils`` (both import from trainer/utils/compute_utils.py)."""
from typing import Dict, Sequence, Tuple

import numpy as np
import torch

from mindspeed_rl.plan.stages import TOOL_CALLS
from mindspeed_rl.data.driver_dock import put_columns


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


def score_rows(reward_list: Sequence, responses, labels, tool_calls=None) -> Tuple[torch.Tensor, Dict[str, float]]:
    """Scores of every row: each reward function's scores times its ``weight``
    (attribute, default 1), summed; plus the functions' own metrics. ``tool_calls``: multi-turn rows' tool
    rounds, given to the functions that take ``tool_call_nums`` (upstream's keyword)."""
    if not reward_list:
        raise ValueError("no reward function: give at least one (rl_config.verifier_function)")
    total, metrics = None, {}
    for reward_fn in reward_list:
        extra = {"tool_call_nums": tool_calls} if tool_calls is not None and getattr(
            reward_fn, "takes_tool_calls", False) else {}
        scores = torch.as_tensor(reward_fn(responses, labels, **extra)).float().reshape(-1)
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
    calls = [int(x) for x in batch[TOOL_CALLS]] if TOOL_CALLS in batch else None
    scores, metrics = score_rows(reward_list, batch["responses"], batch["labels"], calls)
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


def advantage_stats(advantages: torch.Tensor) -> Dict[str, float]:
    """Mean, std and the fraction of exact zeros over every advantage value of the round (one tensor)."""
    flat = advantages.reshape(-1).float()
    return {"advantages/mean": float(flat.mean()), "advantages/std": float(flat.std()) if flat.numel() > 1 else 0.0,
            "advantages/zero_frac": float((flat == 0).float().mean())}
