"""The continuous multi-turn loop's figures and requests (models/rollout/vllm_agent.py), on a clock the test holds:
the trace of every engine step, the tool times, latencies and busy time, the sampling arguments of each request,
the turn count of a conversation moved between engines twice."""
import asyncio
import time
from types import SimpleNamespace

import pytest

from mindspeed_rl.agent.conversation import ANSWERED, MAX_TOOL_CALLS
from mindspeed_rl.plan.rollout_spec import RolloutSpec
from mindspeed_rl.models.rollout.vllm_agent import serve_conversations
from mindspeed_rl.balance.rollout_queue import COMPLETE, RUNNING, LocalSource, RolloutQueue
from tests.ut.agent.fakes import Tool
from tests.ut.agent.test_agent_serve import EOS, SCRIPT, Clock, HandoffSource, TurnEngine, _agent, _source, \
    _turn_tokens, _vllm, seed_of


class RecordingEngine(TurnEngine):
    """TurnEngine that also records each request's prompt length (by the step it joined at) and each step's live
    requests."""

    def __init__(self):
        super().__init__()
        self.prompts, self.live_counts = [], []

    def add_request(self, rid, prompt, params):
        self.prompts.append((Clock.steps, len(prompt["prompt_token_ids"])))
        super().add_request(rid, prompt, params)

    def step(self):
        self.live_counts.append(len(self.live))
        return super().step()


class Counter:
    """A clock that advances one second per read from 1000: each interval is a count of reads, never wall time."""

    def __init__(self):
        self.reads = []

    def __call__(self):
        self.reads.append(1000.0 + len(self.reads))
        return self.reads[-1]


def _backend(cap, log_probs=True, params=None):
    backend = _vllm(cap)
    if not log_probs:
        backend.settings = RolloutSpec("vllm", "test", max_num_seqs=cap, logprobs=None)
    backend.llm = SimpleNamespace(llm_engine=RecordingEngine())
    if params is not None:
        def record(sampling, seed, eos_id, budget=None):
            params.append((sampling, eos_id))
            return seed, budget
        backend._params = record
    return backend


def _quick_agent():
    """The agent of test_agent_serve with its slow tool answering at once (no wait on the engine's steps)."""
    agent = _agent()
    agent.runner.tools["slow"] = Tool(lambda a: "at once")
    return agent


def _serve(rows, cap, clock, agent=None, **kw):
    agent, backend, queue = agent or _quick_agent(), _backend(cap, **kw), RolloutQueue()
    queue.load(0, len(rows), 1, cap=cap)
    Clock.steps = 0
    try:
        return backend, serve_conversations(backend, agent, _source(queue, rows), "sampling", seed_of, EOS, clock)
    finally:
        agent.close()


def test_each_step_is_traced_with_its_live_rows_and_the_prompt_tokens_that_joined_before_it():
    params = []
    backend, served = _serve(sorted(SCRIPT), 2, Counter(), params=params)
    engine = backend.llm.llm_engine
    assert len(served.trace) == len(engine.live_counts) == Clock.steps
    # one step per record, its live requests (never more than the slots), one read of the clock on each side
    assert [t[0] for t in served.trace] == [1] * Clock.steps
    assert [t[1] for t in served.trace] == engine.live_counts
    assert all(t[3] == 1.0 for t in served.trace)
    joined = [sum(n for step, n in engine.prompts if step == k) for k in range(Clock.steps)]
    assert [t[2] for t in served.trace] == joined and sum(joined) == sum(n for _, n in engine.prompts)
    # every request carries the round's sampling and the EOS id
    assert params and set(params) == {("sampling", EOS)}
    # each row's turns joined in order, one request per turn
    for row in SCRIPT:
        turns = [t for r, t, _ in engine.admitted if r == row]
        assert turns == list(range(served.turn_stats[served.rows.index(row)]["turns"])), row


def test_tool_times_add_up_and_the_busy_time_spans_the_serve():
    # row 3 alone: two tool rounds with nothing else to run, every waited second is idle; its tool answers only once
    # the loop read the clock again (so the loop waits on it at least once a round)
    clock, agent = Counter(), _quick_agent()

    async def after_a_read(arguments):
        seen = len(clock.reads)
        for _ in range(5000):  # the waiting loop reads the clock at least once a second; 5 s bound
            if len(clock.reads) > seen:
                return str(arguments.get("a", 0) + arguments.get("b", 0))
            await asyncio.sleep(0.001)
        return "the loop never read the clock"
    agent.runner.tools["add"] = Tool(after_a_read)
    _, served = _serve([3], 1, clock, agent=agent)
    assert served.turn_stats[0]["tool_rounds"] == 2
    assert served.tool_busy == 0 and served.tool_wait == served.tool_running >= 2
    assert served.busy == clock.reads[-1] - clock.reads[0]
    assert all(0 < latency <= served.busy for latency in served.latency)
    # row 2's tool answers once the engine made step 20 (row 4 runs 60): the engine is busy from row 2's call on
    clock, agent = Counter(), _agent()

    async def at_step_20(_):
        for _ in range(5000):  # row 4's steps take microseconds; a 25 s bound
            if Clock.steps >= 20:
                return "late"
            await asyncio.sleep(0.005)
        return "the engine never got to step 20"
    agent.runner.tools["slow"] = Tool(at_step_20)
    _, served = _serve([2, 4], 2, clock, agent=agent)
    call = len(_turn_tokens(2, 0))
    assert served.tool_busy >= 20 - call > 0 and served.tool_running == served.tool_wait + served.tool_busy
    assert served.busy == clock.reads[-1] - clock.reads[0]
    assert all(0 < latency <= served.busy for latency in served.latency)


def test_without_log_probs_the_loop_serves_none():
    _, served = _serve([0, 1], 2, Counter(), log_probs=False)
    assert served.log_probs is None and sorted(served.rows) == [0, 1]
    assert served.turn_stats[served.rows.index(0)]["stop"] == ANSWERED


def test_an_answer_that_ends_at_eos_on_its_last_budget_token_is_answered():
    agent = _quick_agent()
    agent.max_tokens = len(_turn_tokens(1, 0))  # the turn's budget is the answer's length: it ends at EOS and budget
    _, served = _serve([1], 1, Counter(), agent=agent)
    assert served.turn_stats[0]["stop"] == ANSWERED


def test_the_queue_hears_the_rows_still_running_with_their_tokens_so_far():
    heard = []
    rows = [4, 1]  # row 4 runs 60 steps; row 1 ends after two and the engine asks for more meanwhile

    def spying(source):
        request = source.request

        def spy(want, progress=None, turns=None):
            def kept():
                report = progress()
                heard.append(report)
                return report
            return request(want, kept if progress else None, turns)
        source.request = spy
        return source

    agent, backend, queue = _agent(), _backend(2), RolloutQueue()
    queue.load(0, 3, 1, cap=1)
    Clock.steps = 0
    try:
        serve_conversations(backend, agent, spying(_source(queue, rows + [0])), None, seed_of, EOS, Counter())
    finally:
        agent.close()
    running = {p for report in heard for p, _, state in report if state == RUNNING}
    assert running == {0}  # row 4 (position 0) was reported running while row 1's end was
    assert any(state == COMPLETE for report in heard for _, _, state in report)


def _handoff(consumer, answers, rows, ends, clock):
    agent, backend = _agent(), _backend(4)
    source = HandoffSource(consumer, answers, rows, ends)
    try:
        return backend, source, serve_conversations(backend, agent, source, None, seed_of, EOS, clock)
    finally:
        agent.close()


def test_a_conversation_moved_twice_counts_both_moves_its_turns_and_its_age():
    rows, steps = [3], lambda: float(Clock.steps)  # row 3: two tool rounds, three turns; one second per step
    handed_on = lambda asked: any(t for _, _, t in asked)  # noqa: E731
    Clock.steps = 100
    backend, first, served = _handoff(0, [("take", [0], [])], rows, handed_on, steps)
    (_, state), = [t for _, _, turns in first.requests for t in turns]
    assert served.rows == [] and state[0].turns == 1 and state[2] == len(_turn_tokens(3, 0))
    # engine 1 runs turn 1 and hands it on; the queue's wait is 0 (sent "in the future": clocks may disagree)
    state = (state[0], state[1], state[2], time.time() + 1000, state[4])
    backend, second, served = _handoff(1, [("take", [], [(0, state)])], rows, handed_on, steps)
    engine = backend.llm.llm_engine
    assert [(r, t) for r, t, _ in engine.admitted] == [(3, 1)]
    # the taken-over turn's prompt (the conversation so far) is its first step's prefill
    assert [t[2] for t in served.trace][:1] == [n for _, n in engine.prompts] and engine.prompts[0][1] > 20
    (_, state), = [t for _, _, turns in second.requests for t in turns]
    age = len(_turn_tokens(3, 0)) + len(_turn_tokens(3, 1))
    assert state[2] == age and state[0].moved == 1
    # back on engine 0 for turn 2, which ends the row
    state = (state[0], state[1], state[2], time.time() + 1000, state[4])
    ends = lambda asked: any(s == COMPLETE for _, report, _ in asked for _, _, s in report or [])  # noqa: E731
    backend, _, served = _handoff(0, [("take", [], [(0, state)])], rows, ends, steps)
    assert [(r, t) for r, t, _ in backend.llm.llm_engine.admitted] == [(3, 2)]
    assert served.rows == [3] and served.turn_stats[0]["moved"] == 2 and served.turn_stats[0]["turns"] == 3
    assert served.turn_stats[0]["stop"] == MAX_TOOL_CALLS
    assert served.latency == [age + len(_turn_tokens(3, 2))]


def test_the_time_in_the_queue_counts_in_the_latency():
    rows, steps = [0], lambda: float(Clock.steps)
    Clock.steps = 0
    _, first, _ = _handoff(0, [("take", [0], [])], rows, lambda asked: any(t for _, _, t in asked), steps)
    (_, state), = [t for _, _, turns in first.requests for t in turns]
    state = (state[0], state[1], state[2], time.time() - 50.0, state[4])  # handed back 50 s ago
    ends = lambda asked: any(s == COMPLETE for _, report, _ in asked for _, _, s in report or [])  # noqa: E731
    _, _, served = _handoff(1, [("take", [], [(0, state)])], rows, ends, steps)
    made = state[2] + len(_turn_tokens(0, 1))
    assert made + 50.0 <= served.latency[0] < made + 50.0 + 600.0  # the test's own time between, bounded loosely


def test_a_handoff_round_whose_first_take_came_with_the_round_hands_turns_back():
    queue = RolloutQueue()
    firsts = queue.load(0, 1, 1, cap=1, handoff=True, first=1)
    source = LocalSource(queue, 0, [0], _source(queue, [0]).inputs, first=firsts[0])
    agent, backend = _agent(), _backend(1)
    Clock.steps = 0
    try:
        served = serve_conversations(backend, agent, source, None, seed_of, EOS, Counter())
    finally:
        agent.close()
    # the only engine takes its own turn back through the queue and ends the row
    assert served.rows == [0] and served.turn_stats[0]["turns"] == 2 and served.turn_stats[0]["moved"] == 0
    assert [(r, t) for r, t, _ in backend.llm.llm_engine.admitted] == [(0, 0), (0, 1)]


@pytest.mark.parametrize("cap", [1, 3])
def test_an_engine_asks_for_its_free_slots_only(cap):
    wants = []

    def spying(source):
        request = source.request

        def spy(want, progress=None, turns=None):
            wants.append(want)
            return request(want, progress, turns)
        source.request = spy
        return source

    agent, backend, queue = _quick_agent(), _backend(cap), RolloutQueue()
    queue.load(0, len(SCRIPT), 1, cap=len(SCRIPT))
    Clock.steps = 0
    try:
        served = serve_conversations(backend, agent, spying(_source(queue, sorted(SCRIPT))), None, seed_of, EOS,
                                     Counter())
    finally:
        agent.close()
    # a conversation waiting on its tool holds no slot; a running one does
    assert wants[0] == cap and all(0 <= w <= cap for w in wants) and sorted(served.rows) == sorted(SCRIPT)


def test_a_take_of_a_fresh_row_and_a_turn_prefills_both():
    rows, steps = [0, 1], lambda: float(Clock.steps)
    Clock.steps = 0
    _, first, _ = _handoff(0, [("take", [0], [])], rows, lambda asked: any(t for _, _, t in asked), steps)
    handed = [t for _, _, turns in first.requests for t in turns]
    ends = lambda asked: sum(s == COMPLETE for _, report, _ in asked for _, _, s in report or []) >= 2  # noqa: E731
    backend, _, served = _handoff(1, [("take", [1], handed)], rows, ends, steps)
    engine = backend.llm.llm_engine
    assert [(r, t) for r, t, _ in engine.admitted] == [(1, 0), (0, 1)] and sorted(served.rows) == [0, 1]
    assert served.trace[0][2] == sum(n for _, n in engine.prompts)  # both joined before the first step
