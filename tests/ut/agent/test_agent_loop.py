"""The turn rule of multi-turn rollouts: when a conversation ends, how tool rounds run beside the caller (deadline,
parallel calls, failures as answers), how answers are cut and rendered, which tokens the loss sees."""
import asyncio
import json
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.agent.agent_loop import AgentLoop
from mindspeed_rl.agent.conversation import ANSWERED, LENGTH, MAX_TOOL_CALLS, Conversation
from mindspeed_rl.agent.tool_block import ToolBlock, chatml_block
from mindspeed_rl.agent.tool_runner import ERROR, OK, SKIPPED, TIMEOUT, ToolRunner, answer_text
from mindspeed_rl.models.tiny_text_tokenizer import build_text_tokenizer
from tests.ut.agent.fakes import TOK, Parser, Tool


def _spec(**kw):
    base = dict(max_tool_calls=2, max_parallel_calls=2, max_total_response_length=400, max_tool_response_length=0,
                truncate_side="middle", call_timeout=5.0)
    base.update(kw)
    return SimpleNamespace(**base)


def _ids(text):
    return TOK.encode(text, add_special_tokens=False)


@pytest.fixture
def loops():
    made = []

    def make(tools, **kw):
        loop = AgentLoop(_spec(**kw), tools, TOK, Parser(), max_tokens=50)
        made.append(loop)
        return loop
    yield make
    for loop in made:
        loop.close()


# ---------------------------------------------------------------- truncation and rendering

def test_answers_render_through_the_models_chat_template_or_as_chatml():
    # the tiny tokenizer's template renders every role the same way
    block = ToolBlock(TOK)
    assert block.use_template
    assert TOK.decode(block.ids(["4", "x"])) == (
        "<|im_start|>tool\n4<|im_end|>\n<|im_start|>tool\nx<|im_end|>\n<|im_start|>assistant\n")
    bare = build_text_tokenizer()
    bare.chat_template = None
    plain = ToolBlock(bare)
    assert not plain.use_template
    assert bare.decode(plain.ids(["4"])) == chatml_block(["4"]) == (
        "<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


QWEN_LIKE = (  # role 'tool' as Qwen2.5 renders it: consecutive answers share one user turn
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_a_qwen_style_template_gives_the_same_block_as_upstream():
    tok = build_text_tokenizer()
    tok.chat_template = QWEN_LIKE
    assert tok.decode(ToolBlock(tok).ids(["1", "2"])) == chatml_block(["1", "2"])


def test_answer_text_reads_upstream_verl_and_plain_results():
    assert answer_text(("out", 0.0, {})) == "out"
    assert answer_text(SimpleNamespace(text="v")) == "v"
    assert answer_text({"result": 1}) == '{"result": 1}'
    assert answer_text(None) == ""


# ---------------------------------------------------------------- the runner

def _run(runner, calls, malformed=()):
    return runner.submit(calls, malformed).result(timeout=120)


def _call(name, **arguments):
    return SimpleNamespace(name=name, arguments=json.dumps(arguments))


def test_failures_are_answers_and_each_is_counted_by_kind():
    def boom(_):
        raise RuntimeError("disk\nfull")

    async def hang(_):
        await asyncio.sleep(600)

    ok, bad, slow = Tool(lambda a: f"v={a['x']}"), Tool(boom), Tool(hang)
    runner = ToolRunner({"ok": ok, "bad": bad, "slow": slow}, timeout=0.5, max_parallel=10)
    try:
        out = _run(runner, [_call("ok", x=3), _call("bad"), _call("slow"), _call("nope"),
                            SimpleNamespace(name="ok", arguments="{not json"),
                            SimpleNamespace(name="ok", arguments="[1]")], ["bad call"])
    finally:
        runner.close()
    assert [r.status for r in out] == [OK, ERROR, TIMEOUT, ERROR, ERROR, ERROR, ERROR]
    assert [r.ran for r in out] == [True, True, True, False, False, False, False]
    assert out[0].text == "v=3"
    assert out[1].text == "error: bad failed: RuntimeError: disk full"
    assert out[2].text == "error: slow timed out after 0.5 s"
    assert out[3].text == "error: there is no tool named 'nope'; tools: ['bad', 'ok', 'slow']"
    assert out[4].text.startswith("error: the arguments of ok are not JSON")
    assert out[5].text == "error: the arguments of ok must be a JSON object"
    assert out[6].text == "error: bad call"
    assert (ok.created, ok.released, slow.released) == (1, 1, 1)  # released after a timeout too


def test_calls_of_a_turn_run_at_once_up_to_max_parallel_the_rest_are_skipped():
    started = []

    async def meet(args):  # each call waits until the other started: run one by one, both would time out
        started.append(args["i"])
        for _ in range(6000):
            if len(started) >= 2:
                return f"met {args['i']}"
            await asyncio.sleep(0.01)
        return "alone"

    runner = ToolRunner({"meet": Tool(meet)}, timeout=120, max_parallel=2)
    try:
        out = _run(runner, [_call("meet", i=0), _call("meet", i=1), _call("meet", i=2)])
    finally:
        runner.close()
    assert [r.text for r in out[:2]] == ["met 0", "met 1"]
    assert out[2].status == SKIPPED and not out[2].ran and out[2].text == ""
    assert sorted(started) == [0, 1]


def test_the_caller_is_free_while_a_round_runs():
    gate = []

    async def wait_gate(_):
        for _ in range(6000):
            if gate:
                return "opened"
            await asyncio.sleep(0.01)
        return "never opened"

    runner = ToolRunner({"w": Tool(wait_gate)}, timeout=120, max_parallel=1)
    try:
        future = runner.submit([_call("w")])
        assert not future.done()  # submit returned while the tool still waits
        gate.append(1)  # the caller acts; the tool sees it
        assert future.result(timeout=120)[0].text == "opened"
    finally:
        runner.close()


# ---------------------------------------------------------------- the turn rule

def _turn(loop, conv, text, ended=True):
    return loop.after_turn(conv, _ids(text), ended=ended)


def test_a_conversation_with_a_tool_round_masks_the_answer_out_of_the_loss(loops):
    loop = loops({"add": Tool(lambda a: str(a["a"] + a["b"]))})
    conv = Conversation(row=3, prompt=_ids("Q"))
    future = _turn(loop, conv, 'CALL add {"a": 2, "b": 5}<|im_end|>')
    assert future is not None and not conv.done
    future.result(timeout=120)
    assert loop.after_tools(conv, future)
    answer = loop.block.ids(["7"])
    first = len(_ids('CALL add {"a": 2, "b": 5}<|im_end|>'))
    assert conv.tokens[first:] == answer
    assert conv.mask == [1] * first + [0] * len(answer)
    assert TOK.decode(conv.next_prompt().tolist()).endswith("<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n")
    assert _turn(loop, conv, "the sum is 7<|im_end|>") is None
    assert conv.stop == ANSWERED
    assert conv.mask[-len(_ids("the sum is 7<|im_end|>")):] == [1] * len(_ids("the sum is 7<|im_end|>"))
    assert (conv.turns, conv.tool_rounds, conv.tool_calls, conv.tool_errors) == (2, 1, 1, 0)
    assert conv.loss_mask().tolist() == conv.mask and conv.response().tolist() == conv.tokens


def test_after_max_tool_calls_rounds_the_next_turn_is_final(loops):
    tool = Tool(lambda a: "r")
    loop = loops({"t": tool}, max_tool_calls=1)
    conv = Conversation(row=0, prompt=[1])
    assert loop.after_tools(conv, _turn(loop, conv, "CALL t {}"))
    assert _turn(loop, conv, "CALL t {}") is None
    assert conv.stop == MAX_TOOL_CALLS and tool.created == 1
    zero = loops({"t": tool}, max_tool_calls=0)  # upstream's default: no tool ever runs
    conv = Conversation(row=1, prompt=[1])
    assert _turn(zero, conv, "CALL t {}") is None and conv.stop == MAX_TOOL_CALLS


def test_a_full_response_or_a_turn_cut_at_its_budget_ends_the_conversation(loops):
    loop = loops({"t": Tool(lambda a: "x" * 50)}, max_total_response_length=60)
    conv = Conversation(row=0, prompt=[1])
    assert _turn(loop, conv, "no call", ended=False) is None and conv.stop == LENGTH  # cut at its budget
    conv = Conversation(row=5, prompt=[1])
    assert _turn(loop, conv, "CALL t {}", ended=False) is not None  # a cut turn is still read for calls
    conv = Conversation(row=1, prompt=[1])
    future = _turn(loop, conv, "CALL t {}")
    assert not loop.after_tools(conv, future)  # 9 + 76 answer tokens >= 60: no room for the answer
    assert conv.stop == LENGTH and conv.mask == [1] * 9 and conv.tool_rounds == 0
    conv = Conversation(row=2, prompt=[1])
    conv.add_turn(list(range(58)))
    assert loop.turn_budget(conv) == 2 and loop.turn_budget(conv, budget=1) == 1
    assert loop.turn_budget(Conversation(row=3, prompt=[1])) == 50  # a turn's own max_tokens
    conv = Conversation(row=4, prompt=[1])
    assert _turn(loop, conv, "y" * 60) is None and conv.stop == LENGTH


def test_errors_and_timeouts_are_counted_and_answered(loops):
    async def hang(_):
        await asyncio.sleep(600)

    loop = loops({"h": Tool(hang)}, call_timeout=0.3, max_tool_response_length=12, truncate_side="left")
    conv = Conversation(row=0, prompt=[1])
    assert loop.after_tools(conv, _turn(loop, conv, "CALL h {} CALL! CALL nope {}"))
    assert (conv.tool_calls, conv.tool_errors, conv.tool_timeouts) == (1, 2, 1)
    text = TOK.decode(conv.tokens)
    assert "error: h tim...(truncated)" in text and "error: there...(truncated)" in text
    assert conv.tool_seconds > 0


def test_a_turn_with_log_probs_keeps_them_and_zero_on_tool_tokens(loops):
    loop = loops({"t": Tool(lambda a: "r")})
    conv = Conversation(row=0, prompt=[1])
    ids = _ids("CALL t {}")
    future = loop.after_turn(conv, ids, log_probs=[-0.5] * len(ids))
    assert loop.after_tools(conv, future)
    assert conv.log_probs[:len(ids)] == [-0.5] * len(ids)
    assert conv.log_probs[len(ids):] == [0.0] * (len(conv.tokens) - len(ids))
    with pytest.raises(ValueError, match="row 0: a turn of 2 tokens came with 1 log-probs"):
        conv.add_turn([1, 2], [0.1])


def test_calls_beyond_max_parallel_are_dropped_unanswered_and_counted(loops):
    loop = loops({"t": Tool(lambda a: f"r{a['i']}")}, max_parallel_calls=1)
    conv = Conversation(row=0, prompt=[1])
    turn = 'CALL t {"i": 1} CALL t {"i": 2}<|im_end|>'
    assert loop.after_tools(conv, _turn(loop, conv, turn))
    assert conv.tokens[len(_ids(turn)):] == loop.block.ids(["r1"])  # one answer: the second call was dropped
    assert (conv.tool_calls, conv.tool_errors, conv.tool_skipped) == (1, 0, 1)
    assert conv.stats()["tool_skipped"] == 1


def test_a_turn_without_log_probs_fills_zeros_and_the_mask_travels_as_bytes():
    conv = Conversation(row=0, prompt=[1])
    conv.add_turn([5, 6])
    conv.add_tool_answer([7])
    assert conv.log_probs == [0.0, 0.0, 0.0]
    mask = conv.loss_mask()
    assert mask.dtype == torch.int8 and mask.tolist() == [1, 1, 0]  # one byte a token through the dock


def test_a_stuck_tool_loop_is_one_line_not_a_hang(loops, monkeypatch):
    from concurrent.futures import Future
    loop = loops({}, call_timeout=0.01)
    assert loop.round_deadline == pytest.approx(60.03)  # three call timeouts and a minute
    monkeypatch.setattr(AgentLoop, "round_deadline", property(lambda self: 0.05))
    with pytest.raises(TimeoutError, match=r"row 4's tool round did not finish in 0.05 s \(each call is cut at "
                                           r"rl_config.tool_call_timeout=0.01 s\): the tool loop is stuck"):
        loop.after_tools(Conversation(row=4, prompt=[1]), Future())  # a round nobody answers
