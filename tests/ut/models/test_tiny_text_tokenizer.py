from transformers import AutoTokenizer

from mindspeed_rl.models.tiny_text_tokenizer import TEXT_VOCAB_SIZE, build_text_tokenizer, save_text_tokenizer

TEXT = "<|im_start|>user\nLena has 12 apples. Ünïcode é 😀 \\boxed{7}  two  spaces\ttab\n<|im_end|>\n"


def test_round_trip_is_lossless_and_ids_are_bytes(tmp_path):
    built = build_text_tokenizer()
    loaded = AutoTokenizer.from_pretrained(save_text_tokenizer(tmp_path / "tok"))
    for tok in (built, loaded):
        ids = tok.encode(TEXT, add_special_tokens=False)
        assert tok.decode(ids) == TEXT
        assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") == 257
        assert ids[1:6] == list(b"user\n")
        assert ids[-2:] == [258, 10]
        assert len(tok) == TEXT_VOCAB_SIZE == 259
        assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_chat_template_renders_qwen_turns(tmp_path):
    loaded = AutoTokenizer.from_pretrained(save_text_tokenizer(tmp_path / "tok"))
    text = loaded.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                                      tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
