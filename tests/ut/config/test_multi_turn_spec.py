"""multi_turn_spec on its own: upstream's eight keys (and tool_call_timeout) checked into one spec, each bad
setting one line naming its key, the tools of the YAML built before anything starts, the plan's line."""
import os
from types import SimpleNamespace

import pytest

from mindspeed_rl.plan.multi_turn import MultiTurnSpec, multi_turn_spec

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs", "tools", "toy_secret.yaml")
GEN = SimpleNamespace(sampling_config={"max_tokens": 8}, max_model_len=64)


def _rl(**kw):
    base = dict(multi_turn_enable=True, tool_config_path=TOY, max_tool_calls=2, max_parallel_calls=1,
                max_total_response_length=16, max_tool_response_length=100, tool_response_truncate_side=None,
                tool_parser_format=None, tool_call_timeout=60.0, partial_rollout_max_split=1)
    base.update(kw)
    return SimpleNamespace(**base)


def test_the_spec_carries_every_setting_and_the_tools_names():
    spec = multi_turn_spec(_rl(tool_response_truncate_side="left", tool_call_timeout=5), GEN, 32, "/tok", True)
    assert spec == MultiTurnSpec(tool_config_path=os.path.abspath(TOY), tool_names=("secret",), max_tool_calls=2,
                                 max_parallel_calls=1, max_total_response_length=16, max_tool_response_length=100,
                                 truncate_side="left", parser="hermes", call_timeout=5.0, tokenizer_path="/tok",
                                 trust_remote_code=True)
    assert multi_turn_spec(_rl(), GEN, 32).truncate_side == "middle"  # verl's default side
    assert multi_turn_spec(_rl(multi_turn_enable=False, tool_config_path=None), GEN, 32) is None


def test_the_plan_line_says_tools_limits_and_masking():
    spec = multi_turn_spec(_rl(), GEN, 32)
    assert spec.describe() == (
        f"multi-turn: tools ['secret'] from {os.path.abspath(TOY)}; at most 2 tool rounds per row, 1 calls per "
        "round, 60 s per call; responses up to 16 tokens (model and tool tokens; tool tokens do not train); tool "
        "answers cut to 100 characters (middle); hermes tool calls")
    assert multi_turn_spec(_rl(max_tool_response_length=0), GEN, 32).describe().endswith(
        "tool answers kept whole; hermes tool calls")


@pytest.mark.parametrize("kw,message", [
    (dict(multi_turn_enable="yes"), "rl_config.multi_turn_enable='yes' must be true or false"),
    (dict(tool_config_path=None), "rl_config.multi_turn_enable needs rl_config.tool_config_path (a tool YAML: "
                                  "tools: a list of class_name, config, tool_schema)"),
    (dict(max_total_response_length=4), "rl_config.max_total_response_length=4 must be at least "
                                        "sampling_config.max_tokens=8 (it bounds the whole response: every model "
                                        "turn and tool answer)"),
    (dict(max_total_response_length=40), "rl_config.max_prompt_length=32 + max_total_response_length=40 exceeds "
                                         "generate_config.max_model_len=64: a long conversation would not fit the "
                                         "engine; lower max_total_response_length or raise max_model_len"),
    (dict(max_total_response_length=0), "rl_config.max_total_response_length=0 must be an int >= 1 with "
                                        "multi_turn_enable"),
    (dict(max_tool_calls=-1), "rl_config.max_tool_calls=-1 must be an int >= 0 with multi_turn_enable"),
    (dict(max_parallel_calls=0), "rl_config.max_parallel_calls=0 must be an int >= 1 with multi_turn_enable"),
    (dict(max_tool_response_length=1.5), "rl_config.max_tool_response_length=1.5 must be an int >= 0 with "
                                         "multi_turn_enable"),
    (dict(tool_response_truncate_side="midle"), "rl_config.tool_response_truncate_side='midle' is not one of "
                                                "['left', 'right', 'middle'] (did you mean 'middle'?)"),
    (dict(tool_parser_format="hermse"), "rl_config.tool_parser_format='hermse' is not one of ['hermes'] (did you "
                                        "mean 'hermes'?)"),
    (dict(tool_call_timeout=0), "rl_config.tool_call_timeout=0 must be a number of seconds > 0"),
])
def test_bad_settings_are_named_word_for_word(kw, message):
    with pytest.raises(ValueError) as err:
        multi_turn_spec(_rl(**kw), GEN, 32)
    assert str(err.value) == message


def test_a_missing_or_bad_tool_file_is_one_line_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match=r"rl_config.tool_config_path='/nope.yaml': no such file \(/nope.yaml\)"):
        multi_turn_spec(_rl(tool_config_path="/nope.yaml"), GEN, 32)
    bad = tmp_path / "tools.yaml"
    bad.write_text("tools:\n  - class_name: mindspeed_rl.tools.nope.Tool\n    config: {type: native}\n")
    with pytest.raises(ValueError) as err:
        multi_turn_spec(_rl(tool_config_path=str(bad)), GEN, 32)
    line = str(err.value)
    assert line.startswith("rl_config.tool_config_path: tool config ") and "mindspeed_rl.tools.nope" in line
    assert "\n" not in line


def test_the_bounds_are_inclusive_where_they_fit_and_the_defaults_hold():
    # a response as long as one turn, a conversation that fills max_model_len exactly, half a second per call
    spec = multi_turn_spec(_rl(max_total_response_length=8, tool_call_timeout=0.5), GEN, 56)
    assert (spec.max_total_response_length, spec.call_timeout) == (8, 0.5)
    assert spec.trust_remote_code is False and spec.tokenizer_path == ""
    with pytest.raises(ValueError, match=r"rl_config.tool_call_timeout=True must be a number of seconds > 0"):
        multi_turn_spec(_rl(tool_call_timeout=True), GEN, 32)
    with pytest.raises(ValueError, match=r"rl_config.tool_call_timeout='5' must be a number of seconds > 0"):
        multi_turn_spec(_rl(tool_call_timeout="5"), GEN, 32)
    # no max_model_len (a backend without one): nothing to fit
    assert multi_turn_spec(_rl(max_total_response_length=4096), SimpleNamespace(
        sampling_config={"max_tokens": 8}, max_model_len=None), 32).max_total_response_length == 4096


def test_an_empty_tool_list_is_refused_by_the_registry_in_one_line(tmp_path):
    empty = tmp_path / "tools.yaml"
    empty.write_text("tools: []\n")
    with pytest.raises(ValueError) as err:
        multi_turn_spec(_rl(tool_config_path=str(empty)), GEN, 32)
    assert str(err.value).startswith("rl_config.tool_config_path: tool config ") and "non-empty" in str(err.value)


def test_a_tool_that_raises_at_start_is_one_line_before_rollout(tmp_path):
    import textwrap
    module = tmp_path / "broken_tools.py"
    module.write_text(textwrap.dedent("""
        from mindspeed_rl.tools.base_tool import BaseTool
        from mindspeed_rl.tools.schemas import OpenAIFunctionToolSchema

        class Broken(BaseTool):
            def __init__(self, config, tool_schema=None):
                raise RuntimeError("the index\\nis missing")

            @classmethod
            def default_tool_schema(cls):
                return OpenAIFunctionToolSchema.model_validate(
                    {"type": "function", "function": {"name": "broken", "description": "x"}})
    """))
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - class_name: broken_tools.Broken\n    config: {type: native}\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ValueError) as err:
            multi_turn_spec(_rl(tool_config_path=str(tools)), GEN, 32)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("broken_tools", None)
    line = str(err.value)
    assert "\n" not in line and "failed to start" in line and "the index is missing" in line
