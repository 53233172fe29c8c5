"""The tokens that hand tool answers back to the model: the chat template's tool turn and the assistant header
after it, as the model's own template renders them (Qwen2.5: one user turn holding a ``<tool_response>`` per
answer). A tokenizer without a chat template gets the same ChatML text."""
from typing import List, Sequence

# a finished assistant turn the tool messages follow; rendering it alone and with them gives the block as the
# difference (a template that adds a default system turn adds it to both)
_BEFORE = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def chatml_block(answers: Sequence[str]) -> str:
    """Qwen2.5's rendering of consecutive tool messages and the generation prompt."""
    body = "".join(f"\n<tool_response>\n{text}\n</tool_response>" for text in answers)
    return f"<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n"


def _template_renders_tools(tokenizer) -> bool:
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = "tool-answer-probe"
    try:
        text = block_text(tokenizer, [probe], use_template=True)
    except Exception:  # a template that refuses role 'tool'
        return False
    return probe in text


def block_text(tokenizer, answers: Sequence[str], use_template: bool = True) -> str:
    if not use_template:
        return chatml_block(answers)
    tools = [{"role": "tool", "content": text} for text in answers]
    before = tokenizer.apply_chat_template(_BEFORE, tokenize=False)
    full = tokenizer.apply_chat_template(_BEFORE + tools, tokenize=False, add_generation_prompt=True)
    if not full.startswith(before):
        raise ValueError("the chat template renders a conversation differently once tool messages follow it; "
                         "the tool answers cannot be appended to a running response")
    # starts at the tool turn's header, as upstream's and verl's blocks do: the model's turn ended at its EOS
    return full[len(before):]


class ToolBlock:
    """Tool answers -> token ids, rendered with the tokenizer's chat template when it knows role 'tool'."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.use_template = _template_renders_tools(tokenizer)

    def ids(self, answers: Sequence[str]) -> List[int]:
        text = block_text(self.tokenizer, answers, self.use_template)
        return list(self.tokenizer.encode(text, add_special_tokens=False))
