"""A worker's agent loop, built from the run plan's MultiTurnSpec: its tools, tokenizer and tool-call parser."""
from mindspeed_rl.agent.agent_loop import AgentLoop


def build_agent(spec, max_tokens: int, model_path: str) -> AgentLoop:
    """``model_path``: the worker's model folder, whose tokenizer serves when the spec names none."""
    from transformers import AutoTokenizer

    from mindspeed_rl.tools.utils.tool_parser import ToolParser
    from mindspeed_rl.tools.utils.tool_registry import initialize_tools_from_config, tools_by_name
    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_path or model_path, trust_remote_code=spec.trust_remote_code)
    tools = tools_by_name(initialize_tools_from_config(spec.tool_config_path))
    return AgentLoop(spec, tools, tokenizer, ToolParser.get_tool_parser(spec.parser, tokenizer), max_tokens)
