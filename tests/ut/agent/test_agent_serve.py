"""Multi-turn rollout over the queue on both serve paths: transformers generate (turn by turn over a take, the
engine waits for each round) and vLLM's continuous batching (a conversation leaves the engine while its tools run,
the engine keeps stepping the others, the next turn joins between steps)."""
import asyncio
import json
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.agent.agent_loop import AgentLoop
from mindspeed_rl.agent.conversation import ANSWERED, LENGTH, MAX_TOOL_CALLS
from mindspeed_rl.agent.metrics import turn_counts, turn_metrics
from mindspeed_rl.plan.rollout_spec import RolloutSpec
from mindspeed_rl.models.rollout.agent_serve import serve_blocking, turn_seed
from mindspeed_rl.models.rollout.results import RolloutResult
from mindspeed_rl.models.rollout.vllm_agent import serve_conversations
from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout
from mindspeed_rl.balance.rollout_queue import COMPLETE, LocalSource, RolloutQueue
from tests.ut.agent.fakes import TOK, Parser, Tool

EOS = TOK.convert_tokens_to_ids("<|im_end|>")
STEP = 1_000_003
# each row's model turns (the stand-in engines read row and turn from the request)
SCRIPT = {
    0: ['CALL add {"a": 1, "b": 2}<|im_end|>', "3<|im_end|>"],
    1: ["4<|im_end|>"],
    2: ["CALL slow {}<|im_end|>", "ok<|im_end|>"],
    3: ['CALL add {"a": 5, "b": 5}<|im_end|>', 'CALL add {"a": 1, "b": 1}<|im_end|>', "CALL add {}<|im_end|>"],
    4: ["x" * 80],  # no EOS: runs into its budget
    5: ["CALL nope {}<|im_end|>", "sorry<|im_end|>"],
}


def _turn_tokens(row, turn):
    return TOK.encode(SCRIPT[row][turn], add_special_tokens=False)


def seed_of(row):
    return 1000 + row


def _row_turn(seed):
    return seed % STEP - 1000, seed // STEP


class Clock:
    """The engine's step count: the slow tool answers only once the engine stepped on without it."""
    steps = 0


def _tools():
    async def slow(_):
        start = Clock.steps
        for _ in range(12000):  # a 60 s bound for steps of microseconds: a busy machine passes too
            if Clock.steps >= start + 5:
                return f"after {Clock.steps - start} steps"
            await asyncio.sleep(0.005)
        return "the engine never stepped"

    return {"add": Tool(lambda a: str(a.get("a", 0) + a.get("b", 0))), "slow": Tool(slow)}


def _agent(**kw):
    spec = dict(max_tool_calls=2, max_parallel_calls=2, max_total_response_length=400, max_tool_response_length=0,
                truncate_side="middle", call_timeout=120.0)
    spec.update(kw)
    return AgentLoop(SimpleNamespace(**spec), _tools(), TOK, Parser(), max_tokens=60)


def _source(queue, rows):
    prompts = [torch.tensor(TOK.encode(f"Question {r}:", add_special_tokens=False)) for r in rows]
    labels = [torch.tensor(TOK.encode(f"truth {r}", add_special_tokens=False)) for r in rows]
    return LocalSource(queue, 0, list(rows), {"prompts": prompts, "labels": labels})


def _check(served, agent):
    by_row = {row: i for i, row in enumerate(served.rows)}
    assert sorted(by_row) == sorted(SCRIPT)
    text = {row: TOK.decode(served.responses[i].tolist()) for row, i in by_row.items()}
    mask = {row: served.masks[i].tolist() for row, i in by_row.items()}
    stats = {row: served.turn_stats[i] for row, i in by_row.items()}
    assert text[1] == "4<|im_end|>" and stats[1]["stop"] == ANSWERED and mask[1] == [1] * len(_turn_tokens(1, 0))
    assert text[0] == SCRIPT[0][0] + TOK.decode(agent.block.ids(["3"])) + SCRIPT[0][1]
    first, answer = len(_turn_tokens(0, 0)), len(agent.block.ids(["3"]))
    assert mask[0] == [1] * first + [0] * answer + [1] * len(_turn_tokens(0, 1))
    assert stats[0]["stop"] == ANSWERED and stats[0]["tool_calls"] == 1 and stats[0]["turns"] == 2
    assert "<|im_start|>tool\n10<|im_end|>" in text[3] and "<|im_start|>tool\n2<|im_end|>" in text[3]
    assert stats[3]["stop"] == MAX_TOOL_CALLS and stats[3]["tool_rounds"] == 2 and stats[3]["turns"] == 3
    assert stats[4]["stop"] == LENGTH and len(served.responses[by_row[4]]) == 60  # a turn's max_tokens, no EOS
    assert "there is no tool named 'nope'" in text[5] and stats[5]["tool_errors"] == 1
    assert stats[5]["tool_calls"] == 0
    for row, i in by_row.items():
        assert served.responses[i].numel() == served.masks[i].numel()
    return text, stats


class ScriptedGenerate:
    """transformers generate as the blocking loop calls it: a batch of prompts, one response each."""
    agent = None
    log_probs = True

    def __init__(self):
        self.calls = []

    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
        self.calls.append([_row_turn(s) for s in seeds])
        out = [torch.tensor(_turn_tokens(*_row_turn(s))[:b], dtype=torch.int32) for s, b in zip(seeds, budgets)]
        return RolloutResult(out, [torch.full((r.numel(),), -0.5) for r in out])


def test_transformers_path_runs_each_take_turn_by_turn_and_waits_for_the_tools():
    agent, backend, queue = _agent(), ScriptedGenerate(), RolloutQueue()
    rows = sorted(SCRIPT)
    queue.load(0, len(rows), 1, chunk=3)
    agent.runner.tools["slow"] = Tool(lambda a: "at once")  # nothing steps while this loop waits on a tool
    try:
        served = serve_blocking(backend, agent, _source(queue, rows), None, seed_of, EOS, None, chunk=3,
                                with_log_probs=True)
    finally:
        agent.close()
    text, stats = _check(served, agent)
    # each row's tools start with its label as ground_truth (verl's and upstream's create keyword)
    assert sorted(k["ground_truth"] for k in agent.runner.tools["add"].kwargs) == ["truth 0", "truth 3", "truth 3"]
    # take 1 (rows 0-2): turn 0 of all three, then turn 1 of the two that called a tool
    assert backend.calls[:2] == [[(0, 0), (1, 0), (2, 0)], [(0, 1), (2, 1)]]
    assert served.tool_wait > 0 and served.tool_running == served.tool_wait and served.tool_busy == 0
    assert turn_metrics([turn_counts(served)])["multi_turn/engine_busy_while_tools"] == 0.0
    i = served.rows.index(0)
    lp, mask = served.log_probs[i], served.masks[i]
    assert torch.equal(lp[mask.bool()], torch.full((int(mask.sum()),), -0.5))
    assert torch.count_nonzero(lp[~mask.bool()]) == 0  # tool tokens: no engine log-prob


class TurnEngine:
    """vLLM's LLMEngine as the continuous loop uses it; one token per live request per step."""

    def __init__(self):
        self.live, self.admitted = {}, []

    def add_request(self, rid, prompt, params):
        seed, budget = params
        row, turn = _row_turn(seed)
        assert rid == f"row{row}t{turn}"
        self.admitted.append((row, turn, Clock.steps))
        self.live[rid] = [_turn_tokens(row, turn)[:budget], 0]

    def step(self):
        Clock.steps += 1
        done = []
        for rid, entry in list(self.live.items()):
            entry[1] += 1
            if entry[1] == len(entry[0]):
                del self.live[rid]
                ids = entry[0]
                out = SimpleNamespace(token_ids=list(ids), finish_reason="stop" if ids[-1] == EOS else "length",
                                      logprobs=[{t: SimpleNamespace(logprob=-0.25)} for t in ids])
                done.append(SimpleNamespace(request_id=rid, finished=True, outputs=[out]))
        return done


def _vllm(cap):
    rollout = VLLMRollout.__new__(VLLMRollout)
    rollout.settings = RolloutSpec("vllm", "test", max_num_seqs=cap, logprobs=0)
    rollout.stale = False
    rollout.llm = SimpleNamespace(llm_engine=TurnEngine())
    rollout._params = lambda sampling, seed, eos_id, budget=None: (seed, budget)
    return rollout


def _serve_vllm(rows, cap, source_of=None):
    """(agent, backend, what the continuous path served) for ``rows`` in queue order, ``cap`` slots."""
    agent, backend, queue = _agent(), _vllm(cap=cap), RolloutQueue()
    queue.load(0, len(rows), 1, cap=cap)
    Clock.steps = 0
    source = _source(queue, rows) if source_of is None else source_of(_source(queue, rows))
    try:
        return agent, backend, serve_conversations(backend, agent, source, None, seed_of, EOS)
    finally:
        agent.close()


def test_vllm_path_keeps_stepping_while_a_conversation_waits_on_its_tool():
    agent, backend, served = _serve_vllm(sorted(SCRIPT), cap=3)
    text, stats = _check(served, agent)
    # the slow tool answered only after the engine stepped five times without row 2: other rows kept running
    assert "after " in text[2] and "the engine never stepped" not in text[2]
    assert stats[2]["tool_calls"] == 1 and stats[2]["stop"] == ANSWERED
    admitted = backend.llm.llm_engine.admitted
    # while row 2 waited on its tool, rows beyond the first take joined the engine
    row2_call_done = [s for r, t, s in admitted if (r, t) == (2, 1)][0]
    assert any(t == 0 and r >= 3 for r, t, s in admitted if s < row2_call_done)
    i = served.rows.index(3)
    lp, mask = served.log_probs[i], served.masks[i]
    assert torch.equal(lp[mask.bool()], torch.full((int(mask.sum()),), -0.25))
    assert torch.count_nonzero(lp[~mask.bool()]) == 0
    counts = turn_counts(served)
    half = {k: v / 2 for k, v in counts.items()}  # two ranks that served half each add up to the same rates
    metrics = turn_metrics([half, half])
    assert metrics == turn_metrics([counts])
    assert metrics["multi_turn/tool_calls_per_row"] == pytest.approx(
        sum(s["tool_calls"] for s in stats.values()) / len(SCRIPT))
    assert metrics["multi_turn/tool_call_rate"] == pytest.approx(
        sum(s["tool_calls"] > 0 for s in stats.values()) / len(SCRIPT))
    assert metrics["multi_turn/turns_per_row"] == pytest.approx(sum(s["turns"] for s in stats.values()) / len(SCRIPT))
    assert turn_metrics([{"timing/x": 1.0}]) == {}
    assert metrics["multi_turn/ended_max_tool_calls"] == pytest.approx(1 / len(SCRIPT))
    assert metrics["multi_turn/tool_errors"] == 1.0
    assert 0 < metrics["multi_turn/tool_token_fraction"] < 1
    # row 2 waited on its tool while the engine stepped the others: busy for a part of the tool time
    assert 0 < served.tool_busy <= served.tool_running
    assert metrics["multi_turn/engine_busy_while_tools"] == pytest.approx(served.tool_busy / served.tool_running)
    assert metrics["multi_turn/tool_share_of_stage"] == pytest.approx(served.tool_running / served.busy)


def test_the_queue_hears_each_conversations_final_length():
    rows, seen = sorted(SCRIPT), []

    def spying(source):
        request = source.request

        def spy(want, progress=None, turns=None):
            def kept():
                report = progress()
                seen.extend(report)
                return report
            return request(want, kept if progress else None, turns)
        source.request = spy
        return source

    _, _, served = _serve_vllm(rows, cap=2, source_of=spying)
    final = {p: n for p, n, state in seen if state == COMPLETE}
    for position, row in enumerate(rows):
        if position in final:  # reported with a later take: the whole response, tool tokens included
            assert final[position] == served.responses[served.rows.index(row)].numel()
    assert final, "no finished conversation was reported to the queue"


def test_turn_seeds_differ_per_turn_and_keep_turn_zero():
    assert turn_seed(1234, 0) == 1234
    assert len({turn_seed(1234, t) for t in range(5)}) == 5
    assert json.dumps(turn_seed(2 ** 63 - 1, 3)).isdigit()


def test_a_conversation_waiting_on_its_tool_frees_its_engine_slot():
    # one slot; row 2 comes first and waits on a tool that answers only after five more engine steps: the engine
    # must take other rows into the freed slot meanwhile (counting the waiting row as live, it would idle)
    rows = [2, 1, 0, 3, 4, 5]
    _, _, served = _serve_vllm(rows, cap=1)
    text = TOK.decode(served.responses[served.rows.index(2)].tolist())
    assert "after " in text and "the engine never stepped" not in text
    assert sorted(served.rows) == sorted(rows)


def test_the_iteration_line_says_the_turns_and_the_tools():
    from mindspeed_rl.agent.metrics import turn_summary
    from mindspeed_rl.trainer.stage_trainer import StageTableTrainer
    counts = {"multi_turn/count/rows": 4.0, "multi_turn/count/turns": 7.0, "multi_turn/count/tool_calls": 3.0,
              "multi_turn/count/tool_errors": 1.0, "multi_turn/count/tool_timeouts": 0.0,
              "multi_turn/count/engine_tool_wait_seconds": 0.25}
    m = turn_metrics([counts])
    assert turn_summary(m) == (" turns/row=1.75 tool_calls/row=0.75 tool_errors=1 tool_timeouts=0 "
                               "engine_idle_on_tools=0.25s")
    assert StageTableTrainer._summary(3, dict(m, **{"reward/mean": 0.5})).endswith(turn_summary(m))
    assert turn_summary({"reward/mean": 0.5}) == ""
    busy = turn_metrics([dict(counts, **{"multi_turn/count/tools_running_seconds": 2.0,
                                         "multi_turn/count/engine_busy_while_tools_seconds": 1.5})])
    assert turn_summary(busy).endswith("engine_idle_on_tools=0.25s busy_while_tools=75%")


class HandoffSource:
    """A consumer's end of a free-routing round, scripted: ``answers`` are its first takes, in order, then empty
    takes until ``ends(requests)`` says the round is over (every request (want, progress, turns) is recorded)."""
    handoff = True

    def __init__(self, consumer, answers, rows, ends, prompts=None):
        self.consumer, self.answers, self.requests, self.drained = consumer, list(answers), [], False
        self.ends, self.empty = ends, 0
        self.rows = rows
        self.prompts = prompts or {r: torch.tensor(TOK.encode(f"Question {r}:", add_special_tokens=False))
                                   for r in rows}
        self._asked = False

    def request(self, want, progress=None, turns=None):
        if self._asked or self.drained:
            return False
        self.requests.append((want, progress() if progress else None, list(turns or ())))
        self._asked = True
        return True

    def poll(self, block=False):
        from mindspeed_rl.balance.rollout_queue import Rows
        if not self._asked:
            return None
        self._asked = False
        answer = self.answers.pop(0) if self.answers else (
            ("drained",) if self.ends(self.requests) else ("take", [], []))
        self.empty += not answer[1:] or not (answer[1] or answer[2])
        if self.empty > 2000:  # each empty take is followed by a short sleep: seconds, never a hang
            raise TimeoutError(f"consumer {self.consumer}: the round never ended")
        if answer[0] == "drained":
            self.drained = True
            return Rows([], [], {"prompts": []})
        _, fresh, turns = answer
        if turns == "handed":  # give back whatever this consumer handed in its last request
            turns = self.requests[-1][2]
        prompts = [self.prompts[self.rows[p]] for p in fresh]
        return Rows(list(fresh), [self.rows[p] for p in fresh], {"prompts": prompts}, list(turns))


def test_free_routing_hands_a_conversation_back_after_its_tool_round_and_another_engine_finishes_it():
    rows = [0]  # row 0: a tool call, the answer, then a final turn
    agent, backend = _agent(), _vllm(cap=4)
    Clock.steps = 0
    first = HandoffSource(0, [("take", [0], [])], rows, ends=lambda asked: any(t for _, _, t in asked))
    try:
        served = serve_conversations(backend, agent, first, None, seed_of, EOS)
    finally:
        agent.close()
    handed = [t for _, _, turns in first.requests for t in turns]
    assert served.rows == [] and len(handed) == 1  # it ran turn 0 only; the next turn went back to the queue
    position, state = handed[0]
    conv = state[0]
    assert position == 0 and conv.row == 0 and conv.turns == 1 and conv.tool_rounds == 1 and conv.engine == 0
    assert [(r, t) for r, t, _ in backend.llm.llm_engine.admitted] == [(0, 0)]
    mask_before = list(conv.mask)
    # another engine (consumer 1) takes the turn over: it runs turn 1 with turn 1's seed and ends the row
    agent, other = _agent(), _vllm(cap=4)
    second = HandoffSource(1, [("take", [], handed)], rows, ends=lambda asked: any(
        s == COMPLETE for _, report, _ in asked for _, _, s in report or []))
    try:
        served = serve_conversations(other, agent, second, None, seed_of, EOS)
    finally:
        agent.close()
    assert [(r, t) for r, t, _ in other.llm.llm_engine.admitted] == [(0, 1)]
    assert served.rows == [0] and served.turn_stats[0]["moved"] == 1 and served.turn_stats[0]["turns"] == 2
    assert TOK.decode(served.responses[0].tolist()) == SCRIPT[0][0] + TOK.decode(agent.block.ids(["3"])) + SCRIPT[0][1]
    assert served.masks[0].tolist() == mask_before + [1] * len(_turn_tokens(0, 1))
    assert served.latency[0] >= state[2]  # its age on the first engine counts
    assert turn_counts(served)["multi_turn/count/turns_moved"] == 1.0
    # the engine reported the row complete with its next ask
    assert any(p == 0 and s == COMPLETE for _, report, _ in second.requests for p, _, s in report or [])


def test_free_routing_on_two_engines_makes_the_same_conversations_as_sticky():
    import threading
    rows = sorted(SCRIPT)
    _, _, sticky = _serve_vllm(rows, cap=2)
    reference = {r: (sticky.responses[i].tolist(), sticky.masks[i].tolist(), sticky.turn_stats[i]["turns"])
                 for i, r in enumerate(sticky.rows)}
    queue, lock = RolloutQueue(), threading.Lock()
    queue.load(0, len(rows), 2, cap=2, handoff=True)
    take = queue.take

    def locked(*args, **kwargs):
        with lock:
            return take(*args, **kwargs)
    queue.take = locked
    Clock.steps = 0
    results, errors = {}, []

    def engine(consumer):
        agent, backend = _agent(), _vllm(cap=2)
        source = _source(queue, rows)
        source.consumer = consumer
        try:
            results[consumer] = serve_conversations(backend, agent, source, None, seed_of, EOS)
        except BaseException as err:  # noqa: BLE001  (reported by the test)
            errors.append(err)
        finally:
            agent.close()
    threads = [threading.Thread(target=engine, args=(c,), daemon=True) for c in (0, 1)]  # a hang fails, not stalls
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and all(not t.is_alive() for t in threads)
    made = {}
    for served in results.values():
        for i, r in enumerate(served.rows):
            assert r not in made  # every row once
            made[r] = (served.responses[i].tolist(), served.masks[i].tolist(), served.turn_stats[i]["turns"])
    # row 2's slow tool says how many engine steps it waited: timing, not routing
    assert {r: v for r, v in made.items() if r != 2} == {r: v for r, v in reference.items() if r != 2}
    assert made[2][1:][1] == reference[2][1:][1] and "after " in TOK.decode(made[2][0])


def test_free_routing_without_fresh_rows_asks_for_turns_every_turn_poll_not_every_step():
    from mindspeed_rl.models.rollout.vllm_agent import TURN_POLL
    rows = [4]  # one row of 60 tokens: 60 engine steps
    ticks = iter(range(10 ** 7))

    def clock():  # a millisecond per reading, whatever the machine's speed
        return next(ticks) * 1e-3

    agent, backend = _agent(), _vllm(cap=4)
    source = HandoffSource(0, [("take", [0], [])], rows, ends=lambda asked: any(
        s == COMPLETE for _, report, _ in asked for _, _, s in report or []))
    source.fresh = 0  # every row of the round is out
    try:
        served = serve_conversations(backend, agent, source, None, seed_of, EOS, clock=clock)
    finally:
        agent.close()
    assert served.rows == [4] and len(served.responses[0]) == 60
    readings_per_step = 3  # the loop reads the clock about this often per step
    assert 2 <= len(source.requests) <= 60 * readings_per_step * 1e-3 / TURN_POLL + 3
