"""Pure tensor helpers to batch variable-length sequences and read response log-probs (or values).

Two layouts are supported:
- packed ("remove padding"): every sequence of a micro-batch is concatenated into one row of shape (1, total);
  `position_ids` restart at 0 for each sequence and attention is kept inside each sequence, either through
  a 4-D block-causal mask (eager / sdpa attention) or through the position_ids alone (flash attention);
- padded: one row per sequence, right padded, with a 2-D attention mask.

Response positions are always given as FLAT indexes into `logits.reshape(-1, vocab)`, so one function serves
both layouts: in the packed layout a flat index is the column in the single row; in the padded layout
sequence b starting its response at column s has flat start `b * T + s`.
"""
from typing import List, Sequence, Tuple, Union

import torch
from torch import Tensor

from mindspeed_rl.utils.padding import pad_sequences  # noqa: F401  (this module's name too)

IntList = Union[Sequence[int], Tensor]


def _as_long(values: IntList, device: torch.device) -> Tensor:
    # list / tuple / tensor of ints -> 1-D long tensor on device
    if isinstance(values, Tensor):
        return values.to(device=device, dtype=torch.long).reshape(-1)
    return torch.tensor(list(values), dtype=torch.long, device=device)


def pack_sequences(sequences: List[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
    """Concatenate 1-D token tensors into one row.

    Returns (input_ids (1, total), position_ids (1, total), cu_seqlens (n + 1,)), all long tensors on the
    device of the first sequence; cu_seqlens[i]:cu_seqlens[i + 1] is sequence i.
    """
    if len(sequences) == 0:
        raise ValueError("pack_sequences needs at least one sequence")
    device = sequences[0].device
    seqs = [s.reshape(-1).to(device=device, dtype=torch.long) for s in sequences]
    lengths = torch.tensor([s.numel() for s in seqs], dtype=torch.long, device=device)
    cu_seqlens = torch.zeros(len(seqs) + 1, dtype=torch.long, device=device)
    cu_seqlens[1:] = torch.cumsum(lengths, dim=0)
    total = int(cu_seqlens[-1])
    input_ids = torch.cat(seqs).reshape(1, total)
    # position within its own sequence: global index minus the start of that sequence
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths)
    position_ids = (torch.arange(total, device=device) - starts).reshape(1, total)
    return input_ids, position_ids, cu_seqlens


def block_causal_mask(cu_seqlens: Tensor, dtype: torch.dtype, device: torch.device = None) -> Tensor:
    """Additive attention mask (1, 1, L, L) of `dtype`.

    0 where query i may attend key j (same sequence and j <= i), -inf elsewhere.
    """
    device = cu_seqlens.device if device is None else device
    cu = cu_seqlens.to(device=device, dtype=torch.long)
    lengths = cu[1:] - cu[:-1]
    total = int(cu[-1])
    seq_id = torch.repeat_interleave(torch.arange(lengths.numel(), device=device), lengths)
    pos = torch.arange(total, device=device)
    allowed = (seq_id[:, None] == seq_id[None, :]) & (pos[None, :] <= pos[:, None])
    mask = torch.full((total, total), float("-inf"), dtype=dtype, device=device)
    mask.masked_fill_(allowed, 0.0)
    return mask.reshape(1, 1, total, total)


def response_token_positions(starts: IntList, lengths: IntList, device: torch.device) -> Tuple[Tensor, List[int]]:
    """FLAT index of every response token (responses in order) and the per-response token counts.

    starts[i] is the flat index of the first token of response i and lengths[i] its token count. Every
    index must be >= 1: the output that scores (or values) a token is read at the position before it.
    """
    starts_t = _as_long(starts, device)
    lengths_t = _as_long(lengths, device)
    if starts_t.numel() != lengths_t.numel():
        raise ValueError("starts and lengths must have the same length")
    split_sizes = [int(n) for n in lengths_t.tolist()]
    total = sum(split_sizes)
    # start of its response + offset inside it
    offsets = torch.zeros_like(lengths_t)
    if lengths_t.numel() > 1:
        offsets[1:] = torch.cumsum(lengths_t, dim=0)[:-1]
    token_pos = torch.repeat_interleave(starts_t - offsets, lengths_t) + torch.arange(total, device=device)
    if total > 0 and int(token_pos.min()) < 1:
        raise ValueError("a response cannot start at the first position (it needs a preceding token)")
    return token_pos, split_sizes


def response_values_from_outputs(outputs: Tensor, starts: IntList, lengths: IntList) -> List[Tensor]:
    """Value of every response token from a one-output head, one float32 tensor per response.

    outputs: (B, T, 1) or (B, T); starts / lengths as in ``response_log_probs_from_logits``. Response token
    t gets the head output at flat position t - 1, the same alignment as its log-prob (the prompt's last
    token gives the value of the first response token).
    """
    if outputs.dim() == 3:
        if outputs.shape[-1] != 1:
            raise ValueError(f"a value head has one output, got {outputs.shape[-1]}")
        outputs = outputs.squeeze(-1)
    flat = outputs.reshape(-1)
    token_pos, split_sizes = response_token_positions(starts, lengths, flat.device)
    return list(torch.split(flat.index_select(0, token_pos - 1).float(), split_sizes))


def response_log_probs_from_logits(
    logits: Tensor,
    input_ids: Tensor,
    starts: IntList,
    lengths: IntList,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> Union[List[Tensor], Tuple[List[Tensor], List[Tensor]]]:
    """Log-prob of every response token, one tensor per response.

    logits: (B, T, V); input_ids: (B, T). starts[i] is the FLAT index (into the B * T tokens) of the first
    token of response i and lengths[i] its token count; the token at flat index t is scored by the logits at
    t - 1, so every start must be >= 1 within its row (a prompt of at least one token precedes it).
    Logits are divided by `temperature` and computed in float32 (log_softmax once over the selected rows).

    Returns a list of 1-D float32 tensors (len == lengths[i]); with with_entropy=True returns
    (log_probs, entropies) where entropies are the entropy of the same softmax rows.
    """
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)
    flat_ids = input_ids.reshape(-1)
    device = flat_logits.device
    token_pos, split_sizes = response_token_positions(starts, lengths, device)
    rows = flat_logits.index_select(0, token_pos - 1).float()
    if temperature != 1.0:
        rows = rows / temperature
    log_norm = torch.log_softmax(rows, dim=-1)
    targets = flat_ids.index_select(0, token_pos).to(device)
    token_lp = log_norm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    log_probs = list(torch.split(token_lp, split_sizes))
    if not with_entropy:
        return log_probs
    probs = torch.exp(log_norm)
    token_ent = -(probs * log_norm).sum(dim=-1)
    return log_probs, list(torch.split(token_ent, split_sizes))
