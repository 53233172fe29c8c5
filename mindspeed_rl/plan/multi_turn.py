"""Multi-turn rollouts with tools (upstream's ``rl_config.multi_turn_enable`` and its seven keys), checked into
one spec.

Each row is a conversation: the model generates until it makes tool calls (``tool_parser_format``) or ends; the
calls run (at most ``max_parallel_calls`` of one turn, each within ``tool_call_timeout`` seconds), their answers
(each cut to ``max_tool_response_length`` characters on ``tool_response_truncate_side``) are appended through the
chat template's tool turn, and the model goes on, until a turn makes no call, ``max_tool_calls`` tool rounds ran, or
the response (model and tool tokens) reaches ``max_total_response_length`` tokens. Tool tokens are masked out of
the loss (the ``response_mask`` column); every token counts in the balancer's workload.
"""
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from mindspeed_rl.algorithms.registry import did_you_mean
from mindspeed_rl.tools.utils.tool_parser import ToolParser
from mindspeed_rl.tools.utils.truncate import TRUNCATE_SIDES



@dataclass(frozen=True)
class MultiTurnSpec:
    tool_config_path: str          # absolute path of the tool YAML (upstream's format)
    tool_names: Tuple[str, ...]    # the tools it declares (their schema's function names)
    max_tool_calls: int            # tool rounds per conversation (a round runs the calls of one turn)
    max_parallel_calls: int        # calls of one turn that run; the rest are answered as skipped
    max_total_response_length: int  # tokens of the whole response: model turns and tool answers
    max_tool_response_length: int  # characters kept of one tool answer (0: all)
    truncate_side: str             # which part of a long answer is kept: left (start), right (end), middle
    parser: str                    # tool-call format of the model's turns
    call_timeout: float            # seconds one tool call may take; past it the call is answered as timed out
    routing: Optional[str] = None  # which engine runs the turn after a tool round (ROUTINGS; None: the plan's)
    tokenizer_path: str = ""       # the tokenizer the workers decode turns and render tool answers with
    trust_remote_code: bool = False

    def describe(self) -> str:
        cut = (f"tool answers cut to {self.max_tool_response_length} characters ({self.truncate_side})"
               if self.max_tool_response_length else "tool answers kept whole")
        return (f"multi-turn: tools {list(self.tool_names)} from {self.tool_config_path}; at most "
                f"{self.max_tool_calls} tool rounds per row, {self.max_parallel_calls} calls per round, "
                f"{self.call_timeout:g} s per call; responses up to {self.max_total_response_length} tokens "
                f"(model and tool tokens; tool tokens do not train); {cut}; {self.parser} tool calls"
                + (f"; {self.routing} routing of the turn after a tool round" if self.routing else ""))


STICKY, FREE = "sticky", "free"
ROUTINGS = (STICKY, FREE)
# benchmarks/bench_agent_rollout.py (vLLM, DP=2, 128 rows, 16 slots per engine): sticky's stage 7 % shorter than
# free's (free evened the engines' busy time, 1.1 % vs 1.7 %, at 0.6 moved turns per row; at 64 rows the two
# stages were equal and free's imbalance a fifth of sticky's); free stays a choice
DEFAULT_ROUTING = STICKY


def _int(rl_config, key: str, low: int) -> int:
    value = getattr(rl_config, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"rl_config.{key}={value!r} must be an int >= {low} with multi_turn_enable")
    return value


def _choice(key: str, value, known: Tuple[str, ...], default: str) -> str:
    if value is None:
        return default
    if value not in known:
        raise ValueError(f"rl_config.{key}={value!r} is not one of {list(known)}{did_you_mean(value, known)}")
    return value


def load_tool_names(path: str) -> Tuple[str, ...]:
    """The tools of the YAML at ``path``, each built once (its class imported, its schema checked): a bad file,
    entry, class or schema is one ValueError line naming it."""
    from mindspeed_rl.tools.utils.tool_registry import initialize_tools_from_config
    return tuple(tool.name for tool in initialize_tools_from_config(path))


def multi_turn_spec(rl_config, generate_config, max_prompt_length: int, tokenizer_path: str = "",
                    trust_remote_code: bool = False):
    """The spec, or None when multi_turn_enable is false; ValueError naming the key on a bad setting."""
    enabled = rl_config.multi_turn_enable
    if not isinstance(enabled, bool):
        raise ValueError(f"rl_config.multi_turn_enable={enabled!r} must be true or false")
    if not enabled:
        return None
    path = rl_config.tool_config_path
    if not path:
        raise ValueError("rl_config.multi_turn_enable needs rl_config.tool_config_path (a tool YAML: tools: a list "
                         "of class_name, config, tool_schema)")
    path = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(path):
        raise ValueError(f"rl_config.tool_config_path={rl_config.tool_config_path!r}: no such file ({path})")
    max_tokens = int(generate_config.sampling_config["max_tokens"])
    total = _int(rl_config, "max_total_response_length", 1)
    if total < max_tokens:
        raise ValueError(f"rl_config.max_total_response_length={total} must be at least "
                         f"sampling_config.max_tokens={max_tokens} (it bounds the whole response: every model turn "
                         f"and tool answer)")
    room = generate_config.max_model_len
    if room is not None and max_prompt_length + total > room:
        raise ValueError(f"rl_config.max_prompt_length={max_prompt_length} + max_total_response_length={total} "
                         f"exceeds generate_config.max_model_len={room}: a long conversation would not fit the "
                         f"engine; lower max_total_response_length or raise max_model_len")
    timeout = rl_config.tool_call_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"rl_config.tool_call_timeout={timeout!r} must be a number of seconds > 0")
    spec = dict(max_tool_calls=_int(rl_config, "max_tool_calls", 0),
                max_parallel_calls=_int(rl_config, "max_parallel_calls", 1),
                max_total_response_length=total,
                max_tool_response_length=_int(rl_config, "max_tool_response_length", 0),
                truncate_side=_choice("tool_response_truncate_side", rl_config.tool_response_truncate_side,
                                      TRUNCATE_SIDES, "middle"),
                parser=_choice("tool_parser_format", rl_config.tool_parser_format, ToolParser.known(), "hermes"),
                call_timeout=float(timeout),
                routing=_choice("multi_turn_routing", getattr(rl_config, "multi_turn_routing", None), ROUTINGS,
                                None))
    try:
        names = load_tool_names(path)
    except ValueError as err:
        raise ValueError(f"rl_config.tool_config_path: {err}") from None
    return MultiTurnSpec(tool_config_path=path, tool_names=names, tokenizer_path=str(tokenizer_path),
                         trust_remote_code=bool(trust_remote_code), **spec)
