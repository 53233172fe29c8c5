"""The blocking multi-turn loop's figures and calls (models/rollout/agent_serve.py), on a clock the test holds:
each generate call's trace record, the tool wait, latencies and busy time, the arguments of each call, the end
of a turn at EOS on its budget's last token, a source whose answer is not there at once."""
import pytest
import torch

from mindspeed_rl.agent.conversation import ANSWERED
from mindspeed_rl.models.rollout.agent_serve import serve_blocking, turn_seed
from mindspeed_rl.models.rollout.results import RolloutResult
from mindspeed_rl.balance.rollout_queue import RolloutQueue
from tests.ut.agent.test_agent_serve import EOS, SCRIPT, ScriptedGenerate, _agent, _row_turn, _source, \
    _turn_tokens, seed_of
from tests.ut.agent.test_vllm_agent_figures import Counter


class RecordingGenerate(ScriptedGenerate):
    """ScriptedGenerate that records each call's arguments and prompt tokens, with or without log-probs."""

    def __init__(self, log_probs=True):
        super().__init__()
        self.args, self.prompt_tokens, self.with_log_probs = [], [], log_probs

    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
        self.args.append((sampling, eos_id, pad_id))
        self.prompt_tokens.append(sum(int(p.numel()) for p in prompts))
        result = super().generate(prompts, sampling, seeds, eos_id, pad_id, budgets)
        return result if self.with_log_probs else RolloutResult(result.responses, None)


def _serve(rows, backend, clock, agent=None, source_of=None, **kw):
    agent, queue = agent or _agent(), RolloutQueue()
    queue.load(0, len(rows), 1, chunk=3)
    agent.runner.tools["slow"] = agent.runner.tools["add"]  # nothing steps while this loop waits on a tool
    source = _source(queue, rows)
    if source_of is not None:
        source = source_of(source)
    try:
        return serve_blocking(backend, agent, source, "sampling", seed_of, EOS, -7, 3, clock, **kw)
    finally:
        agent.close()


def test_each_generate_is_traced_and_timed_and_gets_the_rounds_arguments():
    backend, clock = RecordingGenerate(), Counter()
    served = _serve(sorted(SCRIPT), backend, clock, with_log_probs=True)
    assert set(backend.args) == {("sampling", EOS, -7)}
    # each call: the longest response, the rows in it, the prompt and response tokens so far, one clock read long
    made = {row: [len(_turn_tokens(row, t)) for t in range(len(SCRIPT[row]))] for row in SCRIPT}
    made[4] = [60]  # row 4 runs into its budget
    assert [t[1] for t in served.trace] == [len(c) for c in backend.calls]
    assert [t[0] for t in served.trace] == [max(min(made[r][t], 60) for r, t in c) for c in backend.calls]
    assert [t[2] for t in served.trace] == backend.prompt_tokens
    assert [t[3] for t in served.trace] == [1.0] * len(backend.calls)
    # every row's turns ran in order, turn k with turn k's seed
    for row in SCRIPT:
        turns = [t for call in backend.calls for r, t in call if r == row]
        assert turns == list(range(served.turn_stats[served.rows.index(row)]["turns"])), row
    # one wait on the tools after each call, one clock read long; latencies and the busy time span the reads
    assert served.tool_wait == served.tool_running == len(backend.calls)
    assert served.busy == clock.reads[-1] - clock.reads[0]
    assert all(0 < latency <= served.busy for latency in served.latency)


def test_without_log_probs_none_are_served():
    served = _serve([0, 1], RecordingGenerate(log_probs=False), Counter())  # the default: no log-probs
    assert served.log_probs is None and sorted(served.rows) == [0, 1]


def test_an_answer_that_ends_at_eos_on_its_last_budget_token_is_answered(monkeypatch):
    monkeypatch.setitem(SCRIPT, 1, ["sorry<|im_end|>"])
    agent = _agent()
    agent.max_tokens = len(_turn_tokens(1, 0))  # the answer fills the turn's budget and ends at EOS
    served = _serve([1], RecordingGenerate(), Counter(), agent=agent)
    assert served.turn_stats[0]["stop"] == ANSWERED


def test_the_loop_waits_for_a_take_that_is_not_there_at_once():
    def slow(source):
        poll = source.poll

        def late(block=False):  # the queue's answer arrives only for a caller that waits
            return poll(block) if block else None
        source.poll = late
        return source

    served = _serve(sorted(SCRIPT), RecordingGenerate(), Counter(), source_of=slow)
    assert sorted(served.rows) == sorted(SCRIPT)


def test_turn_seeds_wrap_at_two_to_the_63():
    assert turn_seed(2 ** 63 - 1, 1) == 1_000_002
    assert turn_seed(5, 2) == 2_000_011
