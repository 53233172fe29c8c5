"""Hermes tool calls: well-formed blocks become calls, each malformed block one error line."""
import json

import pytest

from mindspeed_rl.tools.schemas import OpenAIFunctionParsedSchema
from mindspeed_rl.tools.utils.tool_parser import HermesToolParser, ToolParser


class CharTokenizer:
    """ids are code points; decode keeps everything (as decode with special tokens kept)."""

    def decode(self, ids):
        return "".join(map(chr, ids))

    def encode(self, text):
        return [ord(c) for c in text]


TOK = CharTokenizer()
HERMES = ToolParser.get_tool_parser("hermes", TOK)


def call(name, **arguments):
    return OpenAIFunctionParsedSchema(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def test_the_canonical_qwen_output_gives_its_call():
    text = 'Let me compute.\n<tool_call>\n{"name": "code_interpreter", "arguments": {"code": "print(1+1)"}}' \
           '\n</tool_call><|im_end|>'
    assert isinstance(HERMES, HermesToolParser) and HERMES.tokenizer is TOK
    assert HERMES.extract_tool_calls(TOK.encode(text)) == [call("code_interpreter", code="print(1+1)")]


def test_whitespace_several_calls_and_unicode_are_kept():
    text = ('<tool_call>  \n\t{"name":"search","arguments":{"query_list":["Zürich"]}}  \n</tool_call>'
            'and <tool_call>{"name": "code_interpreter", "arguments": {}}</tool_call>')
    calls, errors = HERMES.parse_text(text)
    assert calls == [call("search", query_list=["Zürich"]), call("code_interpreter")]
    assert errors == [] and "Zürich" in calls[0].arguments


def test_text_without_a_tool_call_gives_nothing():
    assert HERMES.parse_text("The answer is \\boxed{4}.") == ([], [])
    assert HERMES.extract_tool_calls(TOK.encode("no calls")) == []


@pytest.mark.parametrize("body, error", [
    ('{"name": "f", "arguments": {"a": 1}', "tool call 1: not valid JSON (Expecting ',' delimiter at line 1 "
                                             "column 36)"),
    ('["f", {}]', 'tool call 1: expected a JSON object with "name" and "arguments", got array'),
    ('{"arguments": {}}', 'tool call 1: "name" is missing'),
    ('{"name": 3, "arguments": {}}', 'tool call 1: "name" must be a non-empty string'),
    ('{"name": "f"}', 'tool call 1 (f): "arguments" is missing'),
    ('{"name": "f", "arguments": "{\\"a\\": 1}"}', 'tool call 1 (f): "arguments" must be a JSON object, got string'),
    ('{"name": "f", "arguments": null}', 'tool call 1 (f): "arguments" must be a JSON object, got null'),
])
def test_each_malformed_block_is_one_error_line(body, error):
    assert HERMES.parse_text(f"<tool_call>{body}</tool_call>") == ([], [error])


def test_good_blocks_survive_a_bad_neighbour_and_errors_are_numbered_by_block():
    text = ('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
            '<tool_call>{oops}</tool_call>'
            '<tool_call>{"name": "b", "arguments": {"x": 2}}</tool_call>')
    calls, errors = HERMES.parse_text(text)
    assert calls == [call("a"), call("b", x=2)]
    assert len(errors) == 1 and errors[0].startswith("tool call 2: not valid JSON")


def test_an_unclosed_block_at_the_end_is_an_error():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call> then <tool_call>{"name": "b", "argu'
    calls, errors = HERMES.parse_text(text)
    assert calls == [call("a")]
    assert errors == ["tool call 2: <tool_call> is not closed by </tool_call>"]
    assert HERMES.parse_text("<tool_call>") == ([], ["tool call 1: <tool_call> is not closed by </tool_call>"])


def test_extract_logs_and_skips_the_malformed(caplog):
    ids = TOK.encode('<tool_call>{"name": "f"}</tool_call>')
    with caplog.at_level("WARNING"):
        assert HERMES.extract_tool_calls(ids) == []
    assert [r.getMessage() for r in caplog.records] == [
        'malformed tool call skipped: tool call 1 (f): "arguments" is missing']


def test_an_unknown_parser_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown tool parser 'hermse' \(did you mean 'hermes'\?\); "
                                         r"known: hermes$"):
        ToolParser.get_tool_parser("hermse", TOK)
    with pytest.raises(ValueError, match=r"^unknown tool parser 'xml'; known: hermes$"):
        ToolParser.get_tool_parser("xml", TOK)


def test_register_adds_a_parser(monkeypatch):
    monkeypatch.setattr(ToolParser, "_registry", dict(ToolParser._registry))

    @ToolParser.register("plain")
    class Plain(ToolParser):
        def extract_tool_calls(self, responses_ids):
            return []

    parser = ToolParser.get_tool_parser("plain", TOK)
    assert isinstance(parser, Plain) and parser.tokenizer is TOK


def test_a_hugging_face_tokenizer_turn_with_its_end_token_parses():
    from mindspeed_rl.models.tiny_text_tokenizer import build_text_tokenizer
    tokenizer = build_text_tokenizer()
    text = 'x<tool_call>\n{"name": "f", "arguments": {"a": "é"}}\n</tool_call><|im_end|>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ToolParser.get_tool_parser("hermes", tokenizer).extract_tool_calls(ids) == [call("f", a="é")]


@pytest.mark.parametrize("body, got", [
    ("true", "boolean"), ("3", "number"), ("1.5", "number"), ('"f"', "string"), ("null", "null"), ("[]", "array"),
])
def test_a_block_that_is_no_object_names_its_json_type(body, got):
    assert HERMES.parse_text(f"<tool_call>{body}</tool_call>") == (
        [], [f'tool call 1: expected a JSON object with "name" and "arguments", got {got}'])


@pytest.mark.parametrize("arguments, got", [("false", "boolean"), ("7", "number"), ("[1]", "array")])
def test_arguments_that_are_no_object_name_their_json_type(arguments, got):
    body = f'{{"name": "f", "arguments": {arguments}}}'
    assert HERMES.parse_text(f"<tool_call>{body}</tool_call>") == (
        [], [f'tool call 1 (f): "arguments" must be a JSON object, got {got}'])


def test_an_unclosed_block_after_malformed_ones_counts_them():
    text = '<tool_call>{oops}</tool_call><tool_call>[1]</tool_call><tool_call>{"name": "a"'
    calls, errors = HERMES.parse_text(text)
    assert calls == [] and len(errors) == 3
    assert errors[2] == "tool call 3: <tool_call> is not closed by </tool_call>"


def test_known_names_the_registered_formats_sorted(monkeypatch):
    assert ToolParser.known() == ("hermes",)
    monkeypatch.setattr(ToolParser, "_registry", dict(ToolParser._registry))
    ToolParser.register("plain")(HermesToolParser)
    ToolParser.register("alpha")(HermesToolParser)
    assert ToolParser.known() == ("alpha", "hermes", "plain")
    with pytest.raises(ValueError, match=r"^unknown tool parser 'xml'; known: alpha, hermes, plain$"):
        ToolParser.get_tool_parser("xml", TOK)
