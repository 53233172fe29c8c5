import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from mindspeed_rl.models.packing import (
    block_causal_mask,
    pack_sequences,
    pad_sequences,
    response_log_probs_from_logits,
)


def _tiny_model(attn_implementation="sdpa"):
    cfg = Qwen2Config(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, tie_word_embeddings=True, max_position_embeddings=64,
    )
    cfg._attn_implementation = attn_implementation
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def _samples():
    # (prompt, response) pairs of different lengths, one empty response
    g = torch.Generator().manual_seed(3)
    shapes = [(3, 4), (1, 2), (5, 1), (2, 0), (4, 6)]
    return [(torch.randint(0, 32, (p,), generator=g), torch.randint(0, 32, (r,), generator=g)) for p, r in shapes]


def _hand_log_probs(logits_row, ids_row, start, length):
    # log_softmax(logits[t - 1])[token t], one position at a time
    lps, ents = [], []
    for t in range(start, start + length):
        logp = torch.log_softmax(logits_row[t - 1].float(), dim=-1)
        lps.append(logp[ids_row[t]])
        ents.append(-(logp.exp() * logp).sum())
    return torch.stack(lps) if lps else torch.zeros(0), torch.stack(ents) if ents else torch.zeros(0)


def test_pack_sequences_shapes_and_positions():
    seqs = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([1, 2, 3, 4])]
    ids, pos, cu = pack_sequences(seqs)
    assert ids.shape == (1, 8) and pos.shape == (1, 8)
    assert ids.dtype == torch.long and pos.dtype == torch.long and cu.dtype == torch.long
    assert ids.tolist() == [[5, 6, 7, 8, 1, 2, 3, 4]]
    assert pos.tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    assert cu.tolist() == [0, 3, 4, 8]


def test_block_causal_mask_values():
    cu = torch.tensor([0, 3, 4, 6])
    mask = block_causal_mask(cu, torch.float32)
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.float32
    seq = [0, 0, 0, 1, 2, 2]
    for i in range(6):
        for j in range(6):
            allowed = seq[i] == seq[j] and j <= i
            value = mask[0, 0, i, j].item()
            assert value == 0.0 if allowed else value == float("-inf")
    assert block_causal_mask(cu, torch.bfloat16).dtype == torch.bfloat16


def test_pad_sequences_right_and_left():
    seqs = [torch.tensor([1, 2, 3]), torch.tensor([4])]
    ids, am = pad_sequences(seqs, pad_id=9)
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9]]
    assert am.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ids.dtype == torch.long and am.dtype == torch.long
    ids, am = pad_sequences(seqs, pad_id=9, padding_side="left")
    assert ids.tolist() == [[1, 2, 3], [9, 9, 4]]
    assert am.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_response_positions_match_hand_computation():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 11, generator=g)
    ids = torch.randint(0, 11, (2, 7), generator=g)
    # row 0: response at columns 2..5; row 1: response at columns 4..6 -> flat start 7 + 4
    starts, lengths = [2, 11], [4, 3]
    lps, ents = response_log_probs_from_logits(logits, ids, starts, lengths, with_entropy=True)
    only_lps = response_log_probs_from_logits(logits, ids, starts, lengths)
    for k, (row, col) in enumerate([(0, 2), (1, 4)]):
        want_lp, want_ent = _hand_log_probs(logits[row], ids[row], col, lengths[k])
        assert lps[k].shape == (lengths[k],)
        torch.testing.assert_close(lps[k], want_lp, atol=1e-6, rtol=0)
        torch.testing.assert_close(ents[k], want_ent, atol=1e-6, rtol=0)
        torch.testing.assert_close(only_lps[k], want_lp, atol=1e-6, rtol=0)


def test_response_log_probs_temperature_empty_and_bad_start():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 5, 6, generator=g)
    ids = torch.randint(0, 6, (1, 5), generator=g)
    lps = response_log_probs_from_logits(logits, ids, torch.tensor([1, 3]), torch.tensor([2, 0]), temperature=0.5)
    assert lps[1].numel() == 0
    want, _ = _hand_log_probs(logits[0] / 0.5, ids[0], 1, 2)
    torch.testing.assert_close(lps[0], want, atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        response_log_probs_from_logits(logits, ids, [0], [2])


def test_response_log_probs_gradient_flows():
    logits = torch.randn(1, 4, 5, requires_grad=True)
    ids = torch.randint(0, 5, (1, 4))
    lps, ents = response_log_probs_from_logits(logits, ids, [1], [3], with_entropy=True)
    (lps[0].sum() + ents[0].sum()).backward()
    assert logits.grad is not None and logits.grad[0, :3].abs().sum() > 0
    assert logits.grad[0, 3].abs().sum() == 0  # the last position predicts nothing scored


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_packed_padded_and_single_forwards_agree(attn, with_entropy):
    model = _tiny_model(attn)
    samples = _samples()
    seqs = [torch.cat([p, r]) for p, r in samples]
    p_lens = [p.numel() for p, _ in samples]
    r_lens = [r.numel() for _, r in samples]

    # one forward per sequence
    single_lp, single_ent = [], []
    with torch.no_grad():
        for s, p, n in zip(seqs, p_lens, r_lens):
            logits = model(input_ids=s[None]).logits
            lp, ent = _hand_log_probs(logits[0], s, p, n)
            single_lp.append(lp)
            single_ent.append(ent)

        # packed: one row, restarting positions and a block-causal mask
        ids, pos, cu = pack_sequences(seqs)
        mask = block_causal_mask(cu, torch.float32)
        logits = model(input_ids=ids, position_ids=pos, attention_mask=mask).logits
        packed = response_log_probs_from_logits(
            logits, ids, [int(cu[k]) + p_lens[k] for k in range(len(seqs))], r_lens, with_entropy=with_entropy
        )

        # padded: right padding, flat starts row * T + prompt length
        pids, am = pad_sequences(seqs, pad_id=0)
        logits = model(input_ids=pids, attention_mask=am).logits
        width = pids.shape[1]
        padded = response_log_probs_from_logits(
            logits, pids, [k * width + p_lens[k] for k in range(len(seqs))], r_lens, with_entropy=with_entropy
        )

    if with_entropy:
        (packed_lp, packed_ent), (padded_lp, padded_ent) = packed, padded
    else:
        packed_lp, padded_lp = packed, padded
    for k in range(len(seqs)):
        assert packed_lp[k].shape == (r_lens[k],)
        torch.testing.assert_close(packed_lp[k], single_lp[k], atol=1e-5, rtol=0)
        torch.testing.assert_close(padded_lp[k], single_lp[k], atol=1e-5, rtol=0)
        if with_entropy:
            torch.testing.assert_close(packed_ent[k], single_ent[k], atol=1e-5, rtol=0)
            torch.testing.assert_close(padded_ent[k], single_ent[k], atol=1e-5, rtol=0)
