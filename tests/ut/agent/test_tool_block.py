"""The tool-answer block: rendered by the tokenizer's chat template when it shows role 'tool', else ChatML;
encoded without special tokens; a template that renders earlier turns differently is refused by name."""
import pytest

from mindspeed_rl.agent.tool_block import ToolBlock, block_text, chatml_block


class TemplateTokenizer:
    """A chat template of its own form: `[role]content;` per message, `[assistant]` as generation prompt.
    ``tool`` says what it does with role 'tool': 'keep', 'drop', 'raise'; ``shift`` renders the first turns
    differently once more messages follow. encode: one id per character, BOS (0) first unless told not to."""

    chat_template = "{{ custom }}"

    def __init__(self, tool="keep", shift=False):
        self.tool, self.shift = tool, shift

    def apply_chat_template(self, messages, tokenize=True, add_generation_prompt=False):
        assert tokenize is False
        out = "<many>" if self.shift and len(messages) > 2 else ""
        for m in messages:
            if m["role"] == "tool":
                if self.tool == "raise":
                    raise ValueError("role tool is not supported")
                if self.tool == "drop":
                    continue
            out += f"[{m['role']}]{m['content']};"
        return out + ("[assistant]" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=True):
        return ([0] if add_special_tokens else []) + [ord(c) for c in text]


def test_a_template_that_shows_tool_answers_renders_the_block():
    tok = TemplateTokenizer()
    assert block_text(tok, ["4", "five"]) == "[tool]4;[tool]five;[assistant]"
    block = ToolBlock(tok)
    assert block.use_template is True
    assert block.ids(["4"]) == [ord(c) for c in "[tool]4;[assistant]"]


@pytest.mark.parametrize("tool", ["drop", "raise"])
def test_a_template_that_drops_or_refuses_tool_answers_falls_back_to_chatml(tool):
    block = ToolBlock(TemplateTokenizer(tool=tool))
    assert block.use_template is False
    assert block.ids(["4"]) == [ord(c) for c in chatml_block(["4"])]


def test_a_tokenizer_without_a_chat_template_attribute_gets_chatml():
    class Plain:
        def encode(self, text, add_special_tokens=True):
            return ([0] if add_special_tokens else []) + [ord(c) for c in text]

    block = ToolBlock(Plain())
    assert block.use_template is False
    assert block.ids(["x"]) == [ord(c) for c in "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n"
                                                "<|im_start|>assistant\n"]


def test_a_template_that_renders_earlier_turns_differently_is_refused():
    with pytest.raises(ValueError) as info:
        block_text(TemplateTokenizer(shift=True), ["4"])
    assert str(info.value) == ("the chat template renders a conversation differently once tool messages follow it; "
                               "the tool answers cannot be appended to a running response")
    assert ToolBlock(TemplateTokenizer(shift=True)).use_template is False
