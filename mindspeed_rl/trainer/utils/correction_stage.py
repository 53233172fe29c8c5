"""Rollout correction's driver stage: every row of the round's old log-probs against the engine's, once.

The math is models/loss/rollout_correction.py; this reads the stage's columns in row order and puts each token's
importance weight and keep flag back for the actor's update (its loss multiplies the policy-gradient term by the
weight and leaves rejected tokens out)."""
from typing import Dict

import torch

from mindspeed_rl.plan.stages import IS_WEIGHTS, LOSS_MASK, RESPONSE_MASK, ROLLOUT_LOG_PROBS
from mindspeed_rl.models.loss.rollout_correction import correct
from mindspeed_rl.algorithms.masked import pad_rows
from mindspeed_rl.data.columnar import ColumnBatch, unpadded_rows


def compute_rollout_correction(td, stage, spec) -> Dict[str, float]:
    """IS weights and kept tokens of the round (``spec``: plan.rollout_correction.CorrectionSpec)."""
    rows = list(range(td.round_rows()))
    batch = td.get_rows(list(stage.inputs), rows)
    lengths = torch.tensor([int(x) for x in batch["response_length"]])
    old, mask = pad_rows([t.double().reshape(-1) for t in batch["old_log_prob"]])
    rollout, _ = pad_rows([t.double().reshape(-1) for t in batch[ROLLOUT_LOG_PROBS]])
    counts = torch.tensor([[o.numel(), r.numel()] for o, r in zip(batch["old_log_prob"], batch[ROLLOUT_LOG_PROBS])])
    wrong = (counts != lengths[:, None]).any(dim=1).nonzero()
    if wrong.numel():  # every row: as many old and rollout log-probs as response tokens
        bad = int(wrong[0, 0])
        raise ValueError(f"rollout correction: row {bad} has {batch['old_log_prob'][bad].numel()} old log-probs, "
                         f"{batch[ROLLOUT_LOG_PROBS][bad].numel()} rollout log-probs and response_length "
                         f"{int(lengths[bad])}")
    if LOSS_MASK in batch:  # multi-turn: tool answers have no engine log-prob; only the model's tokens count
        model, _ = pad_rows([t.double().reshape(-1) for t in batch[LOSS_MASK]])
        mask = mask & model.bool()
    weights, keep, metrics = correct(old, rollout, mask, spec)
    td.put_experience(ColumnBatch(flat={IS_WEIGHTS: unpadded_rows(weights, lengths),
                                        RESPONSE_MASK: unpadded_rows(keep, lengths)}), rows)
    return metrics
