"""Rule-based rewards for the toy tasks: named verifiers and their weighted sum."""
from typing import Callable, Dict, List

import torch

from mindspeed_rl.models.tiny_model import MAX_TOY_LENGTH


def _tokens(t: torch.Tensor) -> List[int]:
    return [int(x) for x in t.reshape(-1).tolist()]


def _before_eos(response: torch.Tensor, eos_id: int) -> List[int]:
    """Response tokens before the first EOS (all of them if there is none)."""
    toks = _tokens(response)
    return toks[:toks.index(eos_id)] if eos_id in toks else toks


def length_match(response: torch.Tensor, label: torch.Tensor, eos_id: int) -> float:
    """max(0, 1 - |len - L| / 8), len = tokens before the first EOS, L = label[0]."""
    target = _tokens(label)[0]
    length = len(_before_eos(response, eos_id))
    return max(0.0, 1.0 - abs(length - target) / MAX_TOY_LENGTH)


def copy_match(response: torch.Tensor, label: torch.Tensor, eos_id: int) -> float:
    """Fraction of label positions that the response repeats at the same position.

    Only tokens before the first EOS count, so nothing after the end of the answer scores.
    """
    want = _tokens(label)
    if not want:
        return 0.0
    got = _before_eos(response, eos_id)[:len(want)]
    return sum(int(a == b) for a, b in zip(got, want)) / len(want)


def base_acc(response: torch.Tensor, label: torch.Tensor, eos_id: int) -> float:
    """1.0 if the tokens before the first EOS equal the label exactly, else 0.0."""
    return float(_before_eos(response, eos_id) == _tokens(label))


VERIFIERS: Dict[str, Callable[[torch.Tensor, torch.Tensor, int], float]] = {
    "length_match": length_match,
    "copy_match": copy_match,
    "base_acc": base_acc,
}


class RuleReward:
    """Scores responses by a weighted sum of named verifiers."""

    def __init__(self, verifier_function: List[str], verifier_weight: List[float], eos_id: int):
        if len(verifier_function) != len(verifier_weight):
            raise ValueError(
                f"verifier_function has {len(verifier_function)} entries but "
                f"verifier_weight has {len(verifier_weight)}")
        unknown = [name for name in verifier_function if name not in VERIFIERS]
        if unknown:
            raise ValueError(f"unknown verifier(s) {unknown}; known: {sorted(VERIFIERS)}")
        self.verifier_function = list(verifier_function)
        self.verifier_weight = [float(w) for w in verifier_weight]
        self.eos_id = int(eos_id)

    def __call__(self, responses: List[torch.Tensor], labels: List[torch.Tensor]) -> torch.Tensor:
        if len(responses) != len(labels):
            raise ValueError(f"got {len(responses)} responses but {len(labels)} labels")
        scores = []
        for response, label in zip(responses, labels):
            total = 0.0
            for name, weight in zip(self.verifier_function, self.verifier_weight):
                total += weight * VERIFIERS[name](response, label, self.eos_id)
            scores.append(total)
        return torch.tensor(scores, dtype=torch.float32)
