"""Which rows make batch number ``step``: epochs over the data, each reshuffled.

Epoch ``e`` orders the rows by a permutation drawn with ``seed + e`` (or keeps
file order when shuffling is off) and serves ``num_rows // batch_size`` whole
batches; the rows left over at the end of an epoch wait for the next epoch,
which deals them again in a new order. Batch ``step`` is found directly, so a
run resumed at data position N (batches already served) continues with batch N.
"""
from typing import List

import torch


def batches_per_epoch(num_rows: int, batch_size: int) -> int:
    if batch_size <= 0:
        raise ValueError(f"batch size must be > 0, got {batch_size}")
    if num_rows < batch_size:
        raise ValueError(f"{num_rows} prompts, fewer than global_batch_size {batch_size}")
    return num_rows // batch_size


def epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool = True) -> List[int]:
    if not shuffle:
        return list(range(num_rows))
    gen = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(num_rows, generator=gen).tolist()


def batch_rows(num_rows: int, batch_size: int, seed: int, step: int, shuffle: bool = True) -> List[int]:
    """Row indices of batch number ``step`` (0-based, counted over all epochs)."""
    per_epoch = batches_per_epoch(num_rows, batch_size)
    epoch, within = divmod(step, per_epoch)
    order = epoch_order(num_rows, seed, epoch, shuffle)
    return order[within * batch_size:(within + 1) * batch_size]
