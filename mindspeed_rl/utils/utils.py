"""Small helpers under upstream's names: masks, position ids, metric means, FLOPs, seeding."""
import os
import random
import time
from typing import Dict, List

import numpy as np
import torch
from torch import Tensor

from mindspeed_rl.utils.dist_sync import all_reduce_scalar


def generate_position_ids(input_ids: Tensor) -> List[List[int]]:
    """Positions 0..S-1 for each of the B rows of a (B, S) batch."""
    rows, width = input_ids.shape[0], input_ids.shape[1]
    return [list(range(width)) for _ in range(rows)]


def generate_mask(data_pad: Tensor, seq_lengths: Tensor) -> Tensor:
    """(B, S) int64 mask: 1 on the first ``seq_lengths[b]`` columns of row b, 0 on the padding."""
    lengths = torch.as_tensor(seq_lengths).reshape(-1).to("cpu", torch.long)
    columns = torch.arange(data_pad.shape[1])
    return (columns[None, :] < lengths[:, None]).to(torch.int64)


def get_tune_attention_mask(attention_mask_1d: Tensor, reset_attention_mask: bool = True,
                            tokenizer_padding_side: str = "right") -> Tensor:
    """(B, 1, S, S) bool mask, True where query i may NOT attend key j:
    j > i (causal) or key j is padding (``attention_mask_1d[b, j] < 0.5``)."""
    if tokenizer_padding_side not in ("left", "right"):
        raise ValueError(f"tokenizer_padding_side must be 'left' or 'right', got {tokenizer_padding_side!r}")
    width = attention_mask_1d.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=attention_mask_1d.device).tril()
    keys = (attention_mask_1d >= 0.5)[:, None, None, :]
    return ~(causal[None, None] & keys)


def append_to_dict(data: Dict, new_data: Dict) -> None:
    """Append each value of ``new_data`` to the list under its key in ``data``."""
    for key, value in new_data.items():
        data.setdefault(key, []).append(value)


def get_batch_metrices_mean(metrics_list: List[Dict]) -> Dict[str, Tensor]:
    """Per-key mean (a 0-d tensor) over a list of metric dicts; empty dicts are skipped."""
    gathered: Dict[str, list] = {}
    for metrics in metrics_list:
        if metrics:
            append_to_dict(gathered, metrics)
    return {key: torch.tensor(values, dtype=torch.float64).mean() for key, values in gathered.items()}


def num_floating_point_operations(args, batch_size: int) -> float:
    """Training FLOPs of one batch (forward + backward, Megatron's estimate) from model dims on ``args``:
    num_layers, hidden_size, num_attention_heads, seq_length, ffn_hidden_size, padded_vocab_size;
    optional kv_channels, group_query_attention/num_query_groups, swiglu, num_experts/moe_router_topk."""
    hidden, heads, layers, seq = args.hidden_size, args.num_attention_heads, args.num_layers, args.seq_length
    head_dim = getattr(args, "kv_channels", None) or hidden // heads
    kv_heads = args.num_query_groups if getattr(args, "group_query_attention", False) else heads
    experts_per_token = args.moe_router_topk if getattr(args, "num_experts", None) else 1
    mlp_factor = 1.5 if getattr(args, "swiglu", False) else 1.0
    attention = (1 + kv_heads / heads + seq / hidden) * (head_dim * heads / hidden)
    mlp = args.ffn_hidden_size / hidden * experts_per_token * mlp_factor
    logits = args.padded_vocab_size / (2 * layers * hidden)
    return 12 * batch_size * seq * layers * hidden * hidden * (attention + mlp + logits)


def seed_all(seed: int = 1234, deterministic: bool = True) -> None:
    """Seed python, numpy and torch (every CUDA/NPU device); with ``deterministic``
    torch uses deterministic algorithms."""
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    npu = getattr(torch, "npu", None)
    if npu is not None and npu.is_available():
        os.environ["HCCL_DETERMINISTIC"] = "True"
        npu.manual_seed_all(seed)
    torch.use_deterministic_algorithms(deterministic)


def synchronize_time() -> str:
    """The earliest wall-clock time over all ranks (local time without a process group), as asctime."""
    earliest = all_reduce_scalar(time.time(), "min")
    return time.asctime(time.localtime(earliest))
