"""The turn rule of a multi-turn rollout (plan/multi_turn.py), independent of the engine that generates.

After each model turn ``after_turn`` decides: the conversation ends (no tool call, max_tool_calls rounds ran, the
response is full), or a round of tool calls starts beside the engine (a future). When it is done,
``after_tools`` appends the answers (the chat template's tool turn, masked out of the loss) and says whether the
model goes on; the next turn's budget is ``turn_budget``. Both backends use it: transformers generate turn by turn
over a chunk, vLLM request by request between engine steps.

Partial rollout: ``start`` resumes a conversation carried from an earlier pass; a turn that stops at the pass's
budget is cut (``CUT``, not read for calls yet: the next pass continues it and reads the whole turn once it ends),
and a tool answer that uses up the pass's budget cuts the conversation right after it."""
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import List, Optional

from mindspeed_rl.agent.conversation import ANSWERED, CUT, LENGTH, MAX_TOOL_CALLS, Conversation
from mindspeed_rl.agent.tool_block import ToolBlock
from mindspeed_rl.agent.tool_runner import ERROR, SKIPPED, TIMEOUT, CallResult, ToolRunner
from mindspeed_rl.tools.utils.truncate import truncate_tool_response


class AgentLoop:
    def __init__(self, spec, tools: dict, tokenizer, parser, max_tokens: int):
        """``spec``: the run plan's MultiTurnSpec; ``tools``: name -> tool; ``parser``: the tool-call parser
        (``parse_text(text) -> (calls, malformed lines)``); ``max_tokens``: one turn's budget
        (sampling_config.max_tokens)."""
        self.spec, self.tokenizer, self.parser, self.max_tokens = spec, tokenizer, parser, int(max_tokens)
        self.block = ToolBlock(tokenizer)
        self.runner = ToolRunner(tools, spec.call_timeout, spec.max_parallel_calls)

    def turn_budget(self, conv: Conversation, budget: Optional[int] = None) -> int:
        """New tokens the next turn may make: a turn's max_tokens (less what a cut turn made already), what is
        left of the whole response, and ``budget`` (default: what is left of the row's pass, partial rollout)."""
        room = self.spec.max_total_response_length - len(conv.tokens)
        made = len(conv.tokens) - conv.turn_start if conv.turn_start is not None else 0
        budget = conv.pass_left if budget is None else budget
        return max(0, min(self.max_tokens - made, room, budget if budget is not None else room))

    def after_turn(self, conv: Conversation, ids, log_probs=None, ended: bool = True) -> Optional[Future]:
        """Record a model turn (``ended``: it stopped on its own, at EOS, not at its token budget); returns the
        future of its tool round, or None when the conversation ended (``conv.stop`` says why). A turn cut at its
        budget is still read for calls, as upstream's and verl's loops do; one cut at the pass's budget is not
        (``CUT``): it goes on in the next pass."""
        begin = conv.turn_start if conv.turn_start is not None else len(conv.tokens)
        conv.add_turn(ids, log_probs)
        if len(conv.tokens) >= self.spec.max_total_response_length:
            conv.stop = LENGTH
            conv.turn_start = None
            return None
        if not ended and conv.pass_left is not None and conv.pass_left <= 0 and \
                len(conv.tokens) - begin < self.max_tokens:
            conv.turn_start, conv.stop = begin, CUT
            return None
        conv.turn_start = None
        text = self.tokenizer.decode(conv.tokens[begin:], skip_special_tokens=False)  # the whole turn
        calls, malformed = self.parser.parse_text(text)
        if not calls and not malformed:
            conv.stop = ANSWERED if ended else LENGTH
        elif conv.all_rounds >= self.spec.max_tool_calls:
            conv.stop = MAX_TOOL_CALLS
        if conv.stop is not None:
            return None
        kwargs = {"ground_truth": conv.ground_truth} if conv.ground_truth is not None else {}
        future = self.runner.submit(calls, malformed, kwargs)
        future.started = time.monotonic()
        return future

    @property
    def round_deadline(self) -> float:
        """Seconds a round may take at most: each call is cut at call_timeout (create, execute), its release too;
        past this the tool loop itself is stuck."""
        return 3 * self.spec.call_timeout + 60.0

    def after_tools(self, conv: Conversation, future: Future) -> bool:
        """Append a finished round's answers; True when the model goes on with another turn."""
        try:
            results: List[CallResult] = future.result(timeout=self.round_deadline)
        except FutureTimeout:
            raise TimeoutError(f"multi-turn: row {conv.row}'s tool round did not finish in {self.round_deadline:g} s "
                               f"(each call is cut at rl_config.tool_call_timeout={self.spec.call_timeout:g} s): "
                               f"the tool loop is stuck") from None
        conv.tool_seconds += time.monotonic() - getattr(future, "started", time.monotonic())
        conv.tool_calls += sum(r.ran for r in results)
        conv.tool_errors += sum(r.status == ERROR for r in results)
        conv.tool_timeouts += sum(r.status == TIMEOUT for r in results)
        conv.tool_skipped += sum(r.status == SKIPPED for r in results)
        answers = [truncate_tool_response(r.text, self.spec.max_tool_response_length, self.spec.truncate_side)
                   for r in results if r.status != SKIPPED]
        ids = self.block.ids(answers)
        if len(conv.tokens) + len(ids) >= self.spec.max_total_response_length:
            conv.stop = LENGTH  # no room for the answers and a turn after them
            return False
        conv.add_tool_answer(ids)
        if conv.pass_left is not None and conv.pass_left <= 0:
            conv.stop = CUT  # the pass's budget is used: the next pass starts with the next turn
            return False
        return True

    def start(self, row: int, prompt, label=None, budget: Optional[int] = None, carried=None) -> Conversation:
        """A row's conversation; ``label``: its label ids (the tools' ground_truth), if the round has labels.
        Partial rollout: ``budget``, the pass's new tokens; ``carried``, the row's state from earlier passes
        (conversation.carried_row: ``prompt`` then ends with its response tokens so far)."""
        truth = self.tokenizer.decode(label.reshape(-1).tolist(), skip_special_tokens=True) if label is not None \
            else None
        ids = prompt.reshape(-1).tolist()
        if carried is None:
            return Conversation(row, ids, ground_truth=truth, budget=budget)
        made, rounds, calls, turn = (int(x) for x in carried.reshape(-1).tolist())
        cut = len(ids) - made
        return Conversation(row, ids[:cut], tokens=ids[cut:], ground_truth=truth, start=made, rounds_before=rounds,
                            calls_before=calls, turn_start=turn if turn >= 0 else None, budget=budget)

    def close(self) -> None:
        self.runner.close()
