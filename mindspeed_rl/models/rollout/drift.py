"""How far the rollout engine's log-probs are from the trainer's for the same sampled tokens."""
from typing import Dict, List

import torch
from torch import Tensor


def rollout_drift(rollout: List[Tensor], trainer: List[Tensor]) -> Dict[str, float]:
    """Token means over all rows: |rollout - trainer| and the k3 estimate of KL(rollout || trainer),
    exp(d) - 1 - d with d = trainer - rollout (the tokens were sampled by the rollout engine)."""
    if len(rollout) != len(trainer):
        raise ValueError(f"rollout drift: {len(rollout)} rows of rollout log-probs, {len(trainer)} of the trainer's")
    for i, (a, b) in enumerate(zip(rollout, trainer)):
        if a.numel() != b.numel():
            raise ValueError(f"rollout drift: row {i} has {a.numel()} rollout log-probs and {b.numel()} "
                             f"trainer log-probs")
    if not rollout:
        return {}
    a = torch.cat([t.reshape(-1).float() for t in rollout])
    b = torch.cat([t.reshape(-1).float() for t in trainer])
    d = b - a
    return {"actor/rollout_log_prob_abs_diff": float(d.abs().mean()),
            "actor/rollout_log_prob_k3_kl": float((torch.expm1(d) - d).mean())}
