import pytest

from mindspeed_rl.datasets.templates import known_prompt_types, render_prompt
from mindspeed_rl.models.tiny_text_tokenizer import build_text_tokenizer

R1 = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
      "The assistant first thinks about the reasoning process in the mind and then provides the user with "
      "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
      "</answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
      "</answer>. Put your final answer within \\boxed{}.\n")


@pytest.mark.parametrize("prompt_type,system,expected", [
    ("empty", None, "What is 2+3?"),
    ("empty", "Be brief.", "Be brief.What is 2+3?"),
    ("qwen", None, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                   "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen", "Be brief.", "<|im_start|>system\nBe brief.<|im_end|>\n"
                          "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen_r1", None, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                      "<|im_start|>user\n" + R1 + "What is 2+3?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen_math_r1", None, "<|im_start|>system\nPlease reason step by step, and put your final answer "
                           "within \\boxed{}.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
                           "<|im_start|>assistant\n"),
    ("chat_template", None, "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"),
    ("chat_template", "Be brief.", "<|im_start|>system\nBe brief.<|im_end|>\n"
                                   "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"),
])
def test_rendering_is_byte_exact(prompt_type, system, expected):
    assert render_prompt("What is 2+3?", prompt_type, system, build_text_tokenizer()) == expected


def test_braces_in_the_text_stay_literal():
    assert render_prompt("{content} {0}", "qwen", "x").endswith("user\n{content} {0}<|im_end|>\n<|im_start|>assistant\n")


def test_unknown_template_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown prompt_type 'qwen9'; known: .*'empty'.*'qwen'.*'qwen_r1'"):
        render_prompt("x", "qwen9")
    assert {"empty", "qwen", "qwen_r1", "chat_template"} <= set(known_prompt_types())


def test_chat_template_needs_a_tokenizer_with_one():
    with pytest.raises(ValueError, match="chat template"):
        render_prompt("x", "chat_template", tokenizer=None)
