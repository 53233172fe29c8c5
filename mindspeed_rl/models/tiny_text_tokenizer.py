"""A small byte-level tokenizer with a Qwen-style chat template, built offline.

Ids 0..255 are the bytes of the UTF-8 text (id == byte value, no merges), so any
text encodes and decodes losslessly; three special tokens follow:
``<|endoftext|>`` (256, padding), ``<|im_start|>`` (257) and ``<|im_end|>``
(258, end of a turn and eos). It lets the tiny model run real text prompts
through the pipeline; it is not meant to learn anything useful.
"""
from typing import Dict

from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
TEXT_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)

# messages -> "<|im_start|>{role}\n{content}<|im_end|>\n" each, then the assistant header
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_symbols() -> Dict[int, str]:
    """One printable unicode character per byte value, as byte-level BPE tokenizers spell bytes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    symbols, extra = {}, 0
    for b in range(256):
        if b in keep:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return symbols


def build_text_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {symbol: b for b, symbol in _byte_symbols().items()}
    for i, tok in enumerate(SPECIAL_TOKENS):
        vocab[tok] = 256 + i
    core = Tokenizer(BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(tok, special=True, normalized=False) for tok in SPECIAL_TOKENS])
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token=IM_END, pad_token=PAD_TOKEN)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_text_tokenizer(path: str) -> str:
    build_text_tokenizer().save_pretrained(path)
    return str(path)
