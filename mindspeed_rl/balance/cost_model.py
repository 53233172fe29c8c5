"""A linear cost model of DP-rank step time, and a step-time simulator.

Each micro-batch costs ``a + b * tokens + c * Q`` seconds, where ``Q`` is the
quadratic (attention) term:

- ``quadratic="sequence"``: ``Q = sum of L^2`` over the micro-batch's sequences,
  what variable-length (flash) attention costs;
- ``quadratic="packed"``: ``Q = tokens^2``, what a packed row with a dense
  block-causal mask costs (eager / sdpa attention, e.g. the CPU path of
  ``CausalLMEngine`` with ``use_remove_padding``).

A rank's cost is the sum over its micro-batches, so per rank the features are
``[micro-batch count, tokens, sum of Q]`` and the same three coefficients apply.
Pure numpy / scipy: lengths in, features and seconds out.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np
from scipy.optimize import lsq_linear, nnls

from mindspeed_rl.balance.seqlen_balancing import (get_seqlen_balanced_partitions, heapq_partition,
                                                 rearrange_micro_batches)

QUADRATIC_MODES = ("sequence", "packed")
SPLIT_METHODS = ("off", "heap", "ours")
OBJECTIVES = ("tokens", "cost")


def _check_mode(quadratic: str):
    if quadratic not in QUADRATIC_MODES:
        raise ValueError(f"quadratic must be one of {QUADRATIC_MODES}, got {quadratic!r}")


def _check_lengths(lengths, name: str) -> np.ndarray:
    """1-D float array of finite, non-negative lengths (may be empty)."""
    arr = np.asarray(lengths, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a flat list of lengths, got shape {arr.shape}")
    if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0):
        raise ValueError(f"{name} must hold finite, non-negative lengths")
    return arr


# ---------------------------------------------------------------- features


def micro_batch_features(lengths_per_micro_batch: Sequence[Sequence[int]],
                         quadratic: str = "sequence") -> np.ndarray:
    """One row ``[1, tokens, Q]`` per micro-batch (shape ``(m, 3)``).

    An empty micro-batch still counts as a pass (``[1, 0, 0]``): the trainer
    runs such no-op passes to keep DP ranks in step.
    """
    _check_mode(quadratic)
    if lengths_per_micro_batch is None or len(lengths_per_micro_batch) == 0:
        raise ValueError("lengths_per_micro_batch is empty: no micro-batches given")
    rows = np.zeros((len(lengths_per_micro_batch), 3))
    for i, mb in enumerate(lengths_per_micro_batch):
        lens = _check_lengths(mb, f"micro-batch {i}")
        tokens = lens.sum()
        rows[i] = (1.0, tokens, tokens * tokens if quadratic == "packed" else np.square(lens).sum())
    return rows


def rank_features(lengths_per_micro_batch: Sequence[Sequence[int]], quadratic: str = "sequence") -> np.ndarray:
    """``[micro-batch count, tokens, sum of Q]`` of one rank (shape ``(3,)``)."""
    return micro_batch_features(lengths_per_micro_batch, quadratic).sum(axis=0)


def _as_features(features) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != 3:
        raise ValueError(f"features must have 3 columns [count, tokens, quadratic], got shape {x.shape}")
    if x.shape[0] == 0:
        raise ValueError("features is empty")
    if not np.all(np.isfinite(x)):
        raise ValueError("features hold a non-finite value")
    return x


# ---------------------------------------------------------------- model


@dataclass
class CostModel:
    """Seconds = a * count + b * tokens + c * Q (see the module docstring)."""
    a: float = 0.0
    b: float = 0.0
    c: float = 0.0
    quadratic: str = "sequence"

    def __post_init__(self):
        _check_mode(self.quadratic)

    @property
    def coef(self) -> np.ndarray:
        return np.array([self.a, self.b, self.c], dtype=np.float64)

    def predict(self, features) -> np.ndarray:
        """Seconds per row of ``features`` (``(m, 3)``; a single ``(3,)`` row gives shape ``(1,)``)."""
        return _as_features(features) @ self.coef

    def micro_batch_cost(self, lengths_per_micro_batch: Sequence[Sequence[int]]) -> float:
        """Predicted seconds of a run of micro-batches (one rank's share)."""
        return float(self.predict(rank_features(lengths_per_micro_batch, self.quadratic))[0])

    def sample_cost(self, lengths) -> np.ndarray:
        """Token-dependent cost of each sequence alone, ``b * L + c * L^2`` (no per-pass term)."""
        lens = _check_lengths(lengths, "lengths")
        return self.b * lens + self.c * lens * lens

    def __add__(self, other: "CostModel") -> "CostModel":
        """Cost of running both (e.g. two forwards plus a training pass)."""
        if not isinstance(other, CostModel):
            return NotImplemented
        if other.quadratic != self.quadratic:
            raise ValueError("cannot add cost models with different quadratic terms")
        return CostModel(self.a + other.a, self.b + other.b, self.c + other.c, self.quadratic)

    def scaled(self, factor: float) -> "CostModel":
        return CostModel(self.a * factor, self.b * factor, self.c * factor, self.quadratic)

    @classmethod
    def fit(cls, features, seconds, nonneg: bool = True, relative: bool = False,
            quadratic: str = "sequence") -> "CostModel":
        """Least-squares fit of (a, b, c) to measured ``seconds``.

        ``nonneg`` keeps every coefficient >= 0 (NNLS). ``relative`` weights
        each row by 1 / seconds, i.e. minimises relative rather than absolute
        error. Columns are scaled to unit norm before solving (the quadratic
        column is orders of magnitude larger than the others).
        """
        _check_mode(quadratic)
        x = _as_features(features)
        y = np.asarray(seconds, dtype=np.float64).reshape(-1)
        if y.size != x.shape[0]:
            raise ValueError(f"features have {x.shape[0]} rows but seconds has {y.size} values")
        if not np.all(np.isfinite(y)):
            raise ValueError("seconds hold a non-finite value")
        if x.shape[0] < 3:
            raise ValueError(f"need at least 3 measurements to fit 3 coefficients, got {x.shape[0]}")
        if relative:
            if np.any(y <= 0):
                raise ValueError("relative fit needs positive seconds")
            w = 1.0 / y
            x, y = x * w[:, None], y * w
        scale = np.linalg.norm(x, axis=0)
        scale[scale == 0] = 1.0  # an all-zero column keeps coefficient 0
        xs = x / scale
        if nonneg:
            coef, _ = nnls(xs, y)
        else:
            coef = lsq_linear(xs, y).x
        coef = coef / scale
        return cls(float(coef[0]), float(coef[1]), float(coef[2]), quadratic)


def r2_score(seconds, predicted) -> float:
    """Coefficient of determination (1 is perfect; 0 is the mean's quality)."""
    y = np.asarray(seconds, dtype=np.float64).reshape(-1)
    p = np.asarray(predicted, dtype=np.float64).reshape(-1)
    if y.size == 0 or y.size != p.size:
        raise ValueError(f"need equally long, non-empty arrays, got {y.size} and {p.size}")
    ss_tot = float(np.square(y - y.mean()).sum())
    ss_res = float(np.square(y - p).sum())
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)


def prediction_error(model: CostModel, features, seconds) -> Dict[str, float]:
    """Quality of ``model`` on (held-out) data: r2, mean / max relative error,
    and the relative error of the total (what a step-time sum sees)."""
    y = np.asarray(seconds, dtype=np.float64).reshape(-1)
    p = model.predict(features)
    if y.size != p.size:
        raise ValueError(f"features have {p.size} rows but seconds has {y.size} values")
    if np.any(y <= 0):
        raise ValueError("relative errors need positive seconds")
    rel = np.abs(p - y) / y
    return {"r2": r2_score(y, p), "mean_rel_err": float(rel.mean()), "max_rel_err": float(rel.max()),
            "total_rel_err": float(abs(p.sum() - y.sum()) / y.sum()), "n": int(y.size)}


# ---------------------------------------------------------------- simulation


def split_groups(group_weights, k: int, method: str, seed: int = 0) -> List[List[int]]:
    """Whole GRPO groups to ``k`` ranks, counts within one of each other.

    ``off``: random split (the unbalanced dock); ``heap``: the seed's heap LPT
    (needs ``k`` to divide the group count); ``ours``: get_seqlen_balanced_partitions.
    """
    w = _check_lengths(group_weights, "group_weights")
    if method not in SPLIT_METHODS:
        raise ValueError(f"method must be one of {SPLIT_METHODS}, got {method!r}")
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k <= 0:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if w.size < k:
        raise ValueError(f"{w.size} groups cannot fill {k} ranks")
    if method == "off":
        order = np.random.default_rng(seed).permutation(w.size)
        return [sorted(p.tolist()) for p in np.array_split(order, k)]
    if method == "heap":
        return heapq_partition(w, int(k), equal_size=True)
    return get_seqlen_balanced_partitions(w, int(k), equal_size=True, method="auto")


def simulate_step_time(lengths, k: int, method: str, n_samples: int, model: CostModel,
                       max_token_len: Optional[int] = None, seed: int = 0,
                       objective: str = "tokens", sync_micro_batches: bool = False) -> Dict[str, object]:
    """Predicted DP step time of one GRPO batch split over ``k`` ranks.

    ``lengths``: tokens per sample, a prompt's ``n_samples`` samples consecutive.
    Groups go whole to ranks (``split_groups``), weighted by token sums
    (``objective="tokens"``, the dock's default) or by the model's per-sample
    cost (``"cost"``, the flops-style objective). Each rank's samples form
    micro-batches by ``rearrange_micro_batches(…, max_token_len)``, or one per
    sample without ``max_token_len``; ``sync_micro_batches`` gives every rank
    the largest count (as the update stage syncs it over DP). Returns ``step`` (slowest rank),
    ``ideal`` (the split's total predicted cost / k), ``ratio`` = step / ideal,
    ``rank_costs``, ``micro_batches`` (count per rank), ``micro_batch_lengths``
    (per rank, per micro-batch) and the ``partition`` of groups.
    """
    lens = _check_lengths(lengths, "lengths")
    if lens.size == 0:
        raise ValueError("lengths is empty")
    if not isinstance(n_samples, (int, np.integer)) or n_samples <= 0:
        raise ValueError(f"n_samples must be a positive int, got {n_samples!r}")
    if lens.size % n_samples:
        raise ValueError(f"{lens.size} lengths are not whole groups of n_samples={n_samples}")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    if not isinstance(model, CostModel):
        raise TypeError(f"model must be a CostModel, got {type(model).__name__}")
    groups = lens.reshape(-1, n_samples)
    per_sample = groups if objective == "tokens" else model.sample_cost(lens).reshape(-1, n_samples)
    parts = split_groups(per_sample.sum(axis=1), k, method, seed)
    rank_lens = [groups[np.asarray(p, dtype=np.int64)].reshape(-1) for p in parts]
    if max_token_len is None:
        rank_mbs = [[[x] for x in r.tolist()] for r in rank_lens]
    else:
        rank_parts = [rearrange_micro_batches(r, max_token_len) for r in rank_lens]
        if sync_micro_batches:
            count = max(len(p) for p in rank_parts)
            rank_parts = [p if len(p) == count else rearrange_micro_batches(r, max_token_len, count)
                          for r, p in zip(rank_lens, rank_parts)]
        rank_mbs = [[r[np.asarray(p, dtype=np.int64)].tolist() for p in ps] for r, ps in zip(rank_lens, rank_parts)]
    costs_arr = np.array([model.micro_batch_cost(mbs) for mbs in rank_mbs])
    counts = [len(mbs) for mbs in rank_mbs]
    step, ideal = float(costs_arr.max()), float(costs_arr.sum() / k)
    return {"step": step, "ideal": ideal, "ratio": step / ideal if ideal > 0 else 1.0,
            "rank_costs": costs_arr.tolist(), "micro_batches": counts, "partition": parts,
            "micro_batch_lengths": rank_mbs}
