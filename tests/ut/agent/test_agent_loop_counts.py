"""AgentLoop's bookkeeping over several rounds: counts and tool seconds add up, the text the parser reads, the
ground truth handed to tools, the exact edges of the response length and of a turn's budget."""
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.agent.agent_loop import AgentLoop
from mindspeed_rl.agent.conversation import ANSWERED, LENGTH, Conversation
from mindspeed_rl.agent.tool_runner import ERROR, OK, SKIPPED, TIMEOUT, CallResult
from tests.ut.agent.fakes import TOK, Parser, Tool
from tests.ut.agent.test_agent_loop import _ids, _spec


@pytest.fixture
def loops():
    made = []

    def make(tools, parser=None, max_tokens=50, **kw):
        loop = AgentLoop(_spec(**kw), tools, TOK, parser or Parser(), max_tokens=max_tokens)
        made.append(loop)
        return loop
    yield make
    for loop in made:
        loop.close()


def _done(results, started=None):
    future = Future()
    future.set_result(results)
    if started is not None:
        future.started = started
    return future


def _result(status, ran=True, text="a"):
    return CallResult(status=status, text=text, ran=ran, seconds=0.0)


def test_counts_of_each_kind_add_up_over_rounds(loops):
    loop = loops({}, max_tool_calls=9)
    conv = Conversation(row=0, prompt=[1])
    round_one = [_result(OK), _result(ERROR), _result(TIMEOUT), _result(SKIPPED, ran=False, text="")]
    assert loop.after_tools(conv, _done(round_one))
    assert (conv.tool_calls, conv.tool_errors, conv.tool_timeouts, conv.tool_skipped) == (3, 1, 1, 1)
    round_two = [_result(OK), _result(OK), _result(ERROR, ran=False), _result(TIMEOUT), _result(TIMEOUT),
                 _result(SKIPPED, ran=False, text=""), _result(SKIPPED, ran=False, text="")]
    assert loop.after_tools(conv, _done(round_two))
    assert (conv.tool_calls, conv.tool_errors, conv.tool_timeouts, conv.tool_skipped) == (3 + 4, 1 + 1, 1 + 2, 1 + 2)
    # the skipped calls get no answer: 3 answers, then 5
    assert conv.tokens == loop.block.ids(["a"] * 3) + loop.block.ids(["a"] * 5)


def test_tool_seconds_add_the_rounds_wall_time_and_nothing_without_a_start(loops):
    loop = loops({})
    conv = Conversation(row=0, prompt=[1])
    assert loop.after_tools(conv, _done([_result(OK)]))  # a round with no start time adds nothing
    assert conv.tool_seconds == pytest.approx(0.0, abs=1e-3)
    assert loop.after_tools(conv, _done([_result(OK)], started=time.monotonic() - 2.0))
    first = conv.tool_seconds
    assert 2.0 <= first < 600.0
    assert loop.after_tools(conv, _done([_result(OK)], started=time.monotonic() - 3.0))
    assert 5.0 <= conv.tool_seconds < 1200.0 and conv.tool_seconds >= first + 3.0


def test_answers_that_exactly_fill_the_response_leave_no_room_for_a_turn(loops):
    answer = len(AgentLoop(_spec(), {}, TOK, Parser(), 50).block.ids(["a"]))
    exact = loops({}, max_total_response_length=10 + answer)
    conv = Conversation(row=0, prompt=[1])
    conv.add_turn(list(range(10)))
    assert not exact.after_tools(conv, _done([_result(OK)]))
    assert conv.stop == LENGTH and len(conv.tokens) == 10
    one_more = loops({}, max_total_response_length=11 + answer)
    conv = Conversation(row=1, prompt=[1])
    conv.add_turn(list(range(10)))
    assert one_more.after_tools(conv, _done([_result(OK)]))
    assert conv.stop is None and len(conv.tokens) == 10 + answer


def test_a_turn_ends_on_its_own_unless_told_otherwise(loops):
    loop = loops({})
    conv = Conversation(row=0, prompt=[1])
    assert loop.after_turn(conv, _ids("no call")) is None
    assert conv.stop == ANSWERED


def test_the_parser_reads_the_turn_with_its_special_tokens():
    seen = []

    class Reading(Parser):
        def parse_text(self, text):
            seen.append(text)
            return super().parse_text(text)

    loop = AgentLoop(_spec(), {}, TOK, Reading(), 50)
    try:
        loop.after_turn(Conversation(row=0, prompt=[1]), _ids("done<|im_end|>"))
    finally:
        loop.close()
    assert seen == ["done<|im_end|>"]


def test_tools_get_the_rows_label_as_ground_truth_or_no_such_argument(loops):
    tool = Tool(lambda a: "r")
    loop = loops({"t": tool})
    labelled = loop.start(0, torch.tensor(_ids("Q")), label=torch.tensor(_ids("42<|endoftext|>")))
    assert labelled.ground_truth == "42"  # special tokens of the label are not part of the truth
    loop.after_tools(labelled, loop.after_turn(labelled, _ids("CALL t {}")))
    bare = loop.start(1, torch.tensor(_ids("Q")))
    assert bare.ground_truth is None
    loop.after_tools(bare, loop.after_turn(bare, _ids("CALL t {}")))
    assert tool.kwargs == [{"ground_truth": "42"}, {}]


def test_a_turns_budget_is_the_least_of_its_limits_and_never_negative(loops):
    loop = loops({}, max_tokens=50, max_total_response_length=60)
    conv = Conversation(row=0, prompt=[1])
    conv.add_turn(list(range(55)))
    assert loop.turn_budget(conv, budget=40) == 5  # the response's room binds, not the pass's budget
    conv.add_turn(list(range(5)))
    assert loop.turn_budget(conv) == 0 and loop.turn_budget(conv, budget=7) == 0
    cut = Conversation(row=1, prompt=[1])
    cut.add_turn(list(range(20)))
    cut.turn_start = 0  # a cut turn that made 20 of its 50
    assert loop.turn_budget(cut, budget=100) == 30
    assert loop.turn_budget(cut, budget=-3) == 0


def test_a_tool_answer_that_uses_the_pass_up_exactly_cuts_after_it(loops):
    answer = len(AgentLoop(_spec(), {}, TOK, Parser(), 50).block.ids(["a"]))
    loop = loops({})
    exact = Conversation(row=0, prompt=[1], budget=10 + answer)
    exact.add_turn(list(range(10)))
    assert not loop.after_tools(exact, _done([_result(OK)]))
    assert exact.stop == "cut" and exact.pass_left == 0
    spare = Conversation(row=1, prompt=[1], budget=11 + answer)
    spare.add_turn(list(range(10)))
    assert loop.after_tools(spare, _done([_result(OK)]))  # one token of the pass left: the model goes on
    assert spare.stop is None and spare.pass_left == 1


def test_a_turn_stopped_with_one_token_of_the_pass_left_is_read_not_cut(loops):
    loop = loops({}, max_tokens=50)
    conv = Conversation(row=0, prompt=[1], budget=len(_ids("no call")) + 1)
    assert loop.after_turn(conv, _ids("no call"), ended=False) is None
    assert conv.stop == LENGTH and conv.turn_start is None  # read (no call), not carried as a cut turn


def test_a_full_response_clears_a_cut_turns_start(loops):
    loop = loops({}, max_total_response_length=30)
    conv = Conversation(row=0, prompt=[1], budget=100)
    conv.add_turn(list(range(20)))
    conv.turn_start = 0  # a turn an earlier pass cut
    assert loop.after_turn(conv, list(range(10)), ended=False) is None
    assert conv.stop == LENGTH and conv.turn_start is None and conv.stats()["turn_start"] == -1


def test_a_carried_conversation_keeps_its_ground_truth(loops):
    loop = loops({})
    carried = torch.tensor([3, 1, 2, -1])  # 3 tokens made, 1 round, 2 calls, no cut turn
    conv = loop.start(0, torch.tensor(_ids("Q") + [7, 8, 9]), label=torch.tensor(_ids("42")), budget=5,
                      carried=carried)
    assert (conv.ground_truth, conv.tokens, conv.start, conv.rounds_before, conv.calls_before) == \
        ("42", [7, 8, 9], 3, 1, 2)
    assert conv.turn_start is None and conv.pass_left == 5
