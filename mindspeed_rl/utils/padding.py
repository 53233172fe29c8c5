"""Stacking 1-D token tensors into a padded batch."""
from typing import List, Tuple

import torch
from torch import Tensor


def pad_sequences(sequences: List[Tensor], pad_id: int, padding_side: str = "right") -> Tuple[Tensor, Tensor]:
    """Stack 1-D token tensors into (B, T) with pad_id; returns (input_ids, attention_mask), both long.

    padding_side "right" (default, for scoring / training) or "left" (for generation).
    """
    if len(sequences) == 0:
        raise ValueError("pad_sequences needs at least one sequence")
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    device = sequences[0].device
    seqs = [s.reshape(-1).to(device=device, dtype=torch.long) for s in sequences]
    width = max(s.numel() for s in seqs)
    input_ids = torch.full((len(seqs), width), int(pad_id), dtype=torch.long, device=device)
    attention_mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for row, s in enumerate(seqs):
        n = s.numel()
        if n == 0:
            continue
        cols = slice(0, n) if padding_side == "right" else slice(width - n, width)
        input_ids[row, cols] = s
        attention_mask[row, cols] = 1
    return input_ids, attention_mask
