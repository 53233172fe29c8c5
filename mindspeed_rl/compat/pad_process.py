"""Padding and truncation of response batches, under upstream's names."""
from typing import List, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from mindspeed_rl.utils.padding import pad_sequences


def remove_padding_and_split_to_list(responses: Tensor, eos_token_id: int, pad_token_id: int,
                                     to_list: bool = False) -> List:
    """Each row cut at its first ``pad_token_id`` (kept once when pad == eos, as the EOS).
    With ``to_list`` the row's last token is dropped and ids come back as python lists."""
    out = []
    for row in responses:
        hits = (row == pad_token_id).nonzero()
        end = int(hits[0, 0]) if hits.numel() else row.numel()
        if pad_token_id == eos_token_id:
            end = min(end + 1, row.numel())
        kept = row[:end]
        out.append(kept[:-1].cpu().tolist() if to_list else kept)
    return out


def pad_multiple(data_list: List[Tensor], pad_id: Union[float, int], multiple: int = 1) -> Tensor:
    """Right-pad 1-D token tensors to a (B, T) batch, T rounded up to ``multiple``."""
    padded, _ = pad_sequences(data_list, pad_id)
    width = padded.shape[1]
    target = -(-width // multiple) * multiple
    return F.pad(padded, (0, target - width), value=pad_id)


def truncate_middle_and_pad(responses: Tensor, input_tensor: Tensor, truncate_lengths: Tensor,
                            pad_value: float = 0.0) -> Tensor:
    """Rows ``input_tensor[i, start:end]`` (``truncate_lengths[i] = (start, end)``, clamped to
    the sequence) moved to the front of a (B, responses.shape[-1], V) tensor filled with ``pad_value``."""
    mbs, seq_len, vocab = input_tensor.shape
    bounds = torch.clamp(truncate_lengths, 0, seq_len)
    out = input_tensor.new_full((mbs, responses.shape[-1], vocab), pad_value)
    for i in range(mbs):
        start, end = int(bounds[i, 0]), int(bounds[i, 1])
        out[i, :end - start] = input_tensor[i, start:end]
    return out


def truncate_rows(tensor: Tensor, index_tensor: Tensor, left_pad: bool = False) -> List[Tensor]:
    """Row i of a (B, S) tensor cut to its first ``index_tensor[i]`` values (the last ones
    with ``left_pad``), each on the CPU."""
    out = []
    for row, keep in zip(tensor, torch.as_tensor(index_tensor).reshape(-1).tolist()):
        keep = int(keep)
        out.append((row[row.numel() - keep:] if left_pad else row[:keep]).cpu())
    return out
