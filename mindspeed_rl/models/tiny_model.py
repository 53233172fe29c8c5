"""Tiny models of every supported family (transformers' own classes) and a word-level
tokenizer over the toy-task vocabulary, built offline."""
import os
from typing import List

import torch
from tokenizers import AddedToken, Tokenizer, decoders
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Digits, Sequence, WhitespaceSplit
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

from mindspeed_rl.families import families

# the toy tool task's pieces of text, one token each: a whole hermes call of the 'secret' tool, and the two halves
# of the ChatML tool turn around its answer (agent/tool_block.chatml_block), so a tool round is three tokens
TOY_TOOL_CALL = '<tool_call>\n{"name": "secret", "arguments": {}}\n</tool_call>'
TOY_TOOL_OPEN = "<|im_start|>user\n<tool_response>\n"
TOY_TOOL_CLOSE = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
# token id == index in this list
TOY_TOKENS: List[str] = (
    [str(d) for d in range(10)]
    + ["+", "=", "<bos>", "<eos>", "<pad>", "<sep>"]
    + [f"<L{i}>" for i in range(1, 9)]
    + [TOY_TOOL_CALL, TOY_TOOL_OPEN, TOY_TOOL_CLOSE]
    + [f"<unused{i}>" for i in range(27, 32)]
)
BOS_ID = 12
EOS_ID = 13
PAD_ID = 14
SEP_ID = 15
LEN_TOKEN_BASE = 16  # id of <L1>
MAX_TOY_LENGTH = 8
TOOL_CALL_ID, TOOL_OPEN_ID, TOOL_CLOSE_ID = 24, 25, 26


def length_token(length: int) -> int:
    """Id of <L{length}> (15 + length) for length in 1..8."""
    if not 1 <= length <= MAX_TOY_LENGTH:
        raise ValueError(f"length must be in 1..{MAX_TOY_LENGTH}, got {length}")
    return LEN_TOKEN_BASE + length - 1


def tiny_qwen2_config(**overrides) -> Qwen2Config:
    """Config of the 2-layer, 64-wide Qwen2 used by the toy tasks; kwargs override any field."""
    kwargs = dict(
        vocab_size=len(TOY_TOKENS),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    kwargs.update(overrides)
    return Qwen2Config(**kwargs)


def build_toy_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level fast tokenizer whose ids are the positions in TOY_TOKENS.

    Every non-digit token is registered as a special added token, and digits are split one by one,
    so that the same text maps to the same ids whether the folder is loaded back as this class or,
    as AutoTokenizer does next to a qwen2 config, as Qwen2Tokenizer (which swaps in a byte-level
    pre-tokenizer and would otherwise break "<sep>" apart).
    """
    vocab = {tok: i for i, tok in enumerate(TOY_TOKENS)}
    core = Tokenizer(WordLevel(vocab=vocab, unk_token="<pad>"))
    core.pre_tokenizer = Sequence([WhitespaceSplit(), Digits(individual_digits=True)])
    core.decoder = decoders.Fuse()  # decode without spaces, as Qwen2Tokenizer does
    core.add_special_tokens([AddedToken(tok, special=True) for tok in TOY_TOKENS if not tok.isdigit()])
    # unk is set to <pad> so that no loader adds an out-of-vocabulary unk token
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<pad>",
    )


def tiny_config(model_type: str = "qwen2", **overrides):
    """HF config of a tiny model of family ``model_type`` (2 layers, 64 wide, the toy vocabulary)."""
    known = families()
    if model_type not in known:
        raise ValueError(f"model_type {model_type!r} has no tiny model; known: {sorted(known)}")
    if model_type == "qwen2":
        return tiny_qwen2_config(**overrides)
    kwargs = dict(vocab_size=len(TOY_TOKENS), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                  tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    kwargs.update(known[model_type].tiny)  # the family's tiny shape (mindspeed_rl/families/)
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def build_tiny_checkpoint(path, seed: int = 0, model_type: str = "qwen2", **overrides) -> str:
    """Save a randomly initialised tiny model of family ``model_type`` plus the toy tokenizer
    under path; return path. ``overrides`` are HF config fields (e.g. from model_arch.hf_config_kwargs)."""
    path = str(path)
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type, **overrides))
    model.save_pretrained(path)
    build_toy_tokenizer().save_pretrained(path)
    return path
