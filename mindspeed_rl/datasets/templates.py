"""Prompt templates by name (``megatron_training.prompt_type``), kept as data.

Each template is three strings: how the system text is wrapped, how the user
text is wrapped (ending where the model's answer starts), and the system text
used when none is given. ``{content}`` marks where the text goes; it is filled
with ``str.replace``, so braces elsewhere (``\\boxed{}``) are literal.
A prompt renders as ``system`` (when there is system text) + ``user``.

``prompt_type: chat_template`` renders with the tokenizer's own chat template
(``apply_chat_template``) instead of a table entry.
"""
from typing import Dict, Optional

CHAT_TEMPLATE = "chat_template"

_QWEN_SYSTEM = "<|im_start|>system\n{content}<|im_end|>\n"
_QWEN_USER = "<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
_R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning process "
    "here </think><answer> answer here </answer>. Put your final answer within \\boxed{}.\n")

TEMPLATES: Dict[str, Dict[str, str]] = {
    "empty": {"system": "{content}", "user": "{content}", "default_system": ""},
    "qwen": {"system": _QWEN_SYSTEM, "user": _QWEN_USER,
             "default_system": "You are a helpful assistant."},
    "qwen_r1": {"system": _QWEN_SYSTEM,
                "user": "<|im_start|>user\n" + _R1_INSTRUCTION + "{content}<|im_end|>\n<|im_start|>assistant\n",
                "default_system": "You are a helpful assistant."},
    "qwen_math_r1": {"system": _QWEN_SYSTEM, "user": _QWEN_USER,
                     "default_system": "Please reason step by step, and put your final answer within \\boxed{}."},
}


def known_prompt_types():
    return sorted(TEMPLATES) + [CHAT_TEMPLATE]


def check_prompt_type(prompt_type: str) -> None:
    if prompt_type != CHAT_TEMPLATE and prompt_type not in TEMPLATES:
        raise ValueError(f"unknown prompt_type {prompt_type!r}; known: {known_prompt_types()}")


def render_prompt(text: str, prompt_type: str, system: Optional[str] = None, tokenizer=None) -> str:
    """The prompt string the model sees for one user text.

    system: the sample's (or the run's) system text; empty or None falls back to the
    template's default system text (none for ``empty`` and ``chat_template``).
    """
    check_prompt_type(prompt_type)
    if prompt_type == CHAT_TEMPLATE:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("prompt_type 'chat_template' needs a tokenizer that has a chat template")
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    template = TEMPLATES[prompt_type]
    system = system or template["default_system"]
    head = template["system"].replace("{content}", system) if system else ""
    return head + template["user"].replace("{content}", text)
