"""Partial rollout of conversations: a pass cuts a turn at its budget without reading it, the next pass resumes the
conversation from its carried state and reads the whole turn once it ends; a tool answer that uses up the pass
cuts the conversation right after it; each pass reports only its own part."""
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.agent.agent_loop import AgentLoop
from mindspeed_rl.agent.conversation import ANSWERED, CUT, LENGTH, MAX_TOOL_CALLS, carried_row, turn_state_row
from tests.ut.agent.fakes import TOK, Parser, Tool

CALL = 'CALL add {"a": 2, "b": 5}<|im_end|>'


def _ids(text):
    return TOK.encode(text, add_special_tokens=False)


@pytest.fixture
def loop():
    spec = SimpleNamespace(max_tool_calls=2, max_parallel_calls=2, max_total_response_length=400,
                           max_tool_response_length=0, truncate_side="middle", call_timeout=60.0)
    tool = Tool(lambda a: str(a["a"] + a["b"]))
    agent = AgentLoop(spec, {"add": tool}, TOK, Parser(), max_tokens=50)
    agent.tool = tool
    yield agent
    agent.close()


def _resume(loop, conv, budget):
    """What the next pass starts from: the pool's carried state of ``conv`` (its whole response so far)."""
    state = carried_row(len(conv.tokens), conv.all_rounds, conv.calls_before + conv.tool_calls,
                        -1 if conv.turn_start is None else conv.turn_start)
    return loop.start(conv.row, conv.next_prompt(), None, budget, state)


def test_a_tool_call_split_by_the_pass_is_read_whole_in_the_next_pass(loop):
    prompt = torch.tensor(_ids("Q"))
    conv = loop.start(7, prompt, budget=10)
    ids = _ids(CALL)
    assert loop.turn_budget(conv) == 10
    # the pass's budget stops the turn after 10 tokens: 'CALL add {' is no call yet, and it is not read
    assert loop.after_turn(conv, ids[:10], [-0.5] * 10, ended=False) is None
    assert conv.stop == CUT and conv.turn_start == 0 and loop.tool.created == 0
    assert turn_state_row(conv.stats()).tolist() == [1, 0, 0]
    # the next pass resumes it: the prompt is the original one, the carried tokens are the response so far
    nxt = _resume(loop, conv, budget=40)
    assert (nxt.prompt, nxt.tokens, nxt.start, nxt.turn_start) == (_ids("Q"), ids[:10], 10, 0)
    assert nxt.prompt_length == len(_ids("Q")) + 10
    assert loop.turn_budget(nxt) == 40  # min(the turn's 50 - 10 made, the pass's 40)
    future = loop.after_turn(nxt, ids[10:], [-0.25] * (len(ids) - 10), ended=True)
    assert future is not None, "the call split across the passes was not found"
    assert loop.after_tools(nxt, future)
    assert loop.tool.created == 1 and nxt.turn_start is None
    answer = loop.block.ids(["7"])
    # this pass's part only: the rest of the turn and the answer, with its mask and log-probs
    assert nxt.response().tolist() == ids[10:] + answer
    assert nxt.mask == [1] * (len(ids) - 10) + [0] * len(answer)
    assert nxt.log_probs == [-0.25] * (len(ids) - 10) + [0.0] * len(answer)
    # the turn began in the first pass: it is counted there, not again
    assert (conv.stats()["turns"], nxt.stats()["turns"], nxt.stats()["tool_calls"]) == (1, 0, 1)


def test_a_tool_answer_that_uses_up_the_pass_cuts_the_conversation_after_it(loop):
    ids = _ids(CALL)
    conv = loop.start(0, torch.tensor(_ids("Q")), budget=len(ids) + 3)
    future = loop.after_turn(conv, ids, ended=True)  # the turn ended with room left: it is read and runs
    assert future is not None
    assert not loop.after_tools(conv, future)  # the 20-token answer passes the pass's last 3 tokens
    assert conv.stop == CUT and conv.turn_start is None  # cut between turns
    assert conv.mask[-1] == 0 and conv.pass_left < 0
    assert turn_state_row(conv.stats()).tolist() == [1, -1, 1]
    nxt = _resume(loop, conv, budget=30)
    assert (nxt.rounds_before, nxt.calls_before, nxt.turn_start) == (1, 1, None)
    assert loop.after_turn(nxt, _ids("7<|im_end|>"), ended=True) is None
    assert nxt.stop == ANSWERED and nxt.stats()["turns"] == 1 and nxt.stats()["called"]


def test_a_turn_that_reaches_its_own_max_tokens_at_the_pass_end_is_read_not_cut(loop):
    conv = loop.start(0, torch.tensor(_ids("Q")), budget=50)
    assert loop.after_turn(conv, _ids("y" * 50), ended=False) is None
    assert conv.stop == LENGTH  # as in one pass: a turn at its max_tokens without a call ends the conversation
    conv = loop.start(1, torch.tensor(_ids("Q")), budget=50)
    assert loop.after_turn(conv, _ids("y" * 49), ended=True) is None and conv.stop == ANSWERED


def test_tool_rounds_of_earlier_passes_count_toward_max_tool_calls(loop):
    conv = loop.start(0, torch.tensor(_ids("Q") + _ids(CALL)), budget=60,
                      carried=carried_row(len(_ids(CALL)), 2, 2, -1))
    assert conv.all_rounds == 2
    assert loop.after_turn(conv, _ids(CALL), ended=True) is None and conv.stop == MAX_TOOL_CALLS
    assert loop.tool.created == 0


def test_without_a_pass_budget_nothing_is_ever_cut(loop):
    conv = loop.start(0, torch.tensor(_ids("Q")))
    assert conv.budget is None and conv.pass_left is None
    future = loop.after_turn(conv, _ids("CALL add {}"), ended=False)  # a turn cut at its budget is still read
    assert future is not None and conv.stop is None
