"""get_tokenizer: a local HF tokenizer with upstream's eod/pad attributes."""
import os
from typing import List, Optional


class HFTokenizer:
    """A transformers tokenizer (``.tokenizer``) with ``eod``/``pad`` ids and token strings;
    other attributes (encode, decode, batch_decode, ...) go to the HF tokenizer."""

    def __init__(self, path: str, trust_remote_code: bool = False):
        from transformers import AutoTokenizer  # heavy: only when a tokenizer is built
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        self.eod, self.eod_token = self.tokenizer.eos_token_id, self.tokenizer.eos_token
        self.pad, self.pad_token = self.tokenizer.pad_token_id, self.tokenizer.pad_token

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def vocab(self) -> dict:
        return self.tokenizer.get_vocab()

    @property
    def inv_vocab(self) -> dict:
        return {i: tok for tok, i in self.vocab.items()}

    def tokenize(self, text: str) -> List[int]:
        return self.tokenizer.encode(text)

    def detokenize(self, token_ids, **kwargs) -> str:
        return self.tokenizer.decode(token_ids, **kwargs)

    def __getattr__(self, name):
        if name == "tokenizer":  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self.tokenizer, name)


def _pair(token_id, token, what: str):
    if (token_id is None) != (token is None):
        raise ValueError(f"give both {what}_token and {what}_token_id, or neither")


def get_tokenizer(tokenizer_model: str, tokenizer_type: str = "HuggingFaceTokenizer",
                  eos_token_id: Optional[int] = None, eos_token: Optional[str] = None,
                  pad_token_id: Optional[int] = None, pad_token: Optional[str] = None,
                  eos_for_pad: bool = True, prompt_type: Optional[str] = None,
                  prompt_type_path: Optional[str] = None, trust_remote_code: bool = False) -> HFTokenizer:
    """Load the tokenizer in directory ``tokenizer_model``. EOS/pad may be given only when the
    tokenizer lacks them; without a pad, EOS pads when ``eos_for_pad``."""
    if tokenizer_type != "HuggingFaceTokenizer":
        raise NotImplementedError(f"tokenizer_type {tokenizer_type!r}: only 'HuggingFaceTokenizer' is supported")
    if prompt_type and prompt_type_path:
        raise NotImplementedError("prompt templates (prompt_type_path) are not implemented; "
                                  "prompts are tokenized without a chat template")
    if not os.path.isdir(tokenizer_model):
        raise ValueError(f"tokenizer_model {tokenizer_model!r} must be a local directory")
    _pair(eos_token_id, eos_token, "eos")
    _pair(pad_token_id, pad_token, "pad")
    tok = HFTokenizer(tokenizer_model, trust_remote_code)
    if eos_token is not None:
        if tok.eod_token is not None:
            raise ValueError(f"the tokenizer already has an EOS token {tok.eod_token!r}")
        tok.eod, tok.eod_token = eos_token_id, eos_token
    if tok.eod is None or tok.eod_token is None:
        raise ValueError("the tokenizer has no EOS token: give eos_token and eos_token_id")
    if pad_token is not None:
        if tok.pad_token is not None:
            raise ValueError(f"the tokenizer already has a pad token {tok.pad_token!r}")
        tok.pad, tok.pad_token = pad_token_id, pad_token
    elif tok.pad_token is None and eos_for_pad:
        tok.pad, tok.pad_token = tok.eod, tok.eod_token
    return tok


def tokenizer_digest(tokenizer) -> str:
    """What token ids mean, in a few characters: the vocabulary's size and a hash of its (token, id) pairs and the
    EOS id. Two tokenizers with one digest map every id to the same token."""
    import hashlib
    import json
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    text = json.dumps([vocab, tokenizer.eos_token_id], ensure_ascii=False)
    return f"{len(vocab)} tokens, {hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}"
