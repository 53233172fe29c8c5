"""Partial rollout of conversations on both serve paths: rows served in passes of a few tokens each, carried in the
pool between them, end as the same conversations (tokens, loss mask, log-probs, turns, tool rounds) as in one
pass; each pass's figures count its own work, so the passes add up to the one pass's."""
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.agent.metrics import turn_counts
from mindspeed_rl.plan.stages import LOSS_MASK, ROLLOUT_LOG_PROBS, TOOL_CALLS, TURN_STATE
from mindspeed_rl.models.rollout.agent_serve import serve_blocking
from mindspeed_rl.models.rollout.results import RolloutResult
from mindspeed_rl.models.rollout.vllm_agent import serve_conversations
from mindspeed_rl.trainer.utils.carried_turns import PASS_COLUMNS
from mindspeed_rl.trainer.utils.carry_pool import CarryPool
from mindspeed_rl.balance.rollout_queue import COMPLETE, CUT, LocalSource, RolloutQueue
from mindspeed_rl.workers.integrated_worker import IntegratedWorker
from tests.ut.agent.fakes import TOK, Tool
from tests.ut.agent.test_agent_serve import EOS, SCRIPT, _agent, _row_turn, _vllm, seed_of

HEADER = TOK.encode("<|im_start|>assistant\n", add_special_tokens=False)  # a tool answer's last tokens
TOTAL = 400  # max_total_response_length of _agent()


def _prompt(row):
    return TOK.encode(f"Question {row}:", add_special_tokens=False)


def _next(row, context, budget):
    """The scripted model reads its context: the turn is the number of tool answers so far, and it goes on from
    the tokens of that turn already made (by an earlier pass too)."""
    response = list(context)[len(_prompt(row)):]
    turn, begin = 0, 0
    for i in range(len(response) - len(HEADER) + 1):
        if response[i:i + len(HEADER)] == HEADER:
            turn, begin = turn + 1, i + len(HEADER)
    ids = TOK.encode(SCRIPT[row][turn], add_special_tokens=False)
    return ids[len(response) - begin:][:budget]


class ContextGenerate:
    """transformers generate, scripted by context."""
    agent = None

    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
        out = [torch.tensor(_next(_row_turn(s)[0], p.tolist(), b), dtype=torch.int32)
               for p, s, b in zip(prompts, seeds, budgets)]
        return RolloutResult(out, [torch.full((r.numel(),), -0.5) for r in out])


class ContextEngine:
    """vLLM's engine, scripted by context, one token per live request per step."""

    def __init__(self):
        self.live = {}

    def add_request(self, rid, prompt, params):
        seed, budget = params
        self.live[rid] = [_next(_row_turn(seed)[0], prompt["prompt_token_ids"], budget), 0]

    def step(self):
        done = []
        for rid, entry in list(self.live.items()):
            entry[1] += 1
            if entry[1] >= len(entry[0]):
                del self.live[rid]
                ids = entry[0]
                out = SimpleNamespace(token_ids=list(ids), finish_reason="stop" if ids and ids[-1] == EOS else "length",
                                      logprobs=[{t: SimpleNamespace(logprob=-0.5)} for t in ids])
                done.append(SimpleNamespace(request_id=rid, finished=True, outputs=[out]))
        return done


def _serve(path, rows, inputs):
    """One serve of ``rows`` (script rows) with the round's ``inputs``, on ``path``."""
    agent, queue = _agent(), RolloutQueue()
    agent.runner.tools["slow"] = Tool(lambda a: "at once")
    source = LocalSource(queue, 0, list(rows), inputs)
    request, source.heard = source.request, []

    def spy(want, progress=None, turns=None):  # what the queue hears of each finished row
        if source.waiting:
            return request(want, progress, turns)
        report = progress() if progress else []
        source.heard += [(rows[p], state) for p, _, state in report if state in (CUT, COMPLETE)]
        return request(want, (lambda: report) if progress else None, turns)
    source.request = spy
    try:
        if path == "transformers":
            queue.load(0, len(rows), 1, chunk=4)
            served = serve_blocking(ContextGenerate(), agent, source, None, seed_of, EOS, None, chunk=4,
                                    with_log_probs=True)
        else:
            queue.load(0, len(rows), 1, cap=3)
            backend = _vllm(cap=3)
            backend.llm = SimpleNamespace(llm_engine=ContextEngine())
            served = serve_conversations(backend, agent, source, None, seed_of, EOS)
        served.heard = source.heard
        return served
    finally:
        agent.close()


def _columns(served, partial):
    """The worker's rollout output columns of what was served (integrated_worker._served_columns)."""
    plan = SimpleNamespace(features=SimpleNamespace(carried_turns=partial),
                           worker=SimpleNamespace(rollout=SimpleNamespace(returns_log_probs=True)))
    return IntegratedWorker._served_columns(SimpleNamespace(run_plan=plan), served)[0]


@pytest.mark.parametrize("path", ["transformers", "vllm"])
def test_a_conversation_carried_over_passes_ends_as_in_one_pass(path):
    rows = sorted(SCRIPT)
    labels = [torch.tensor(TOK.encode(f"truth {r}", add_special_tokens=False)) for r in rows]
    prompts = [torch.tensor(_prompt(r)) for r in rows]
    whole = _serve(path, rows, {"prompts": prompts, "labels": labels}).ordered(rows)
    one = _columns(whole, partial=False)

    pool = CarryPool(1, TOTAL, 7, EOS, extra_columns=("labels",), turns=True)  # passes of 7 tokens
    pool.add({"prompts": prompts, "labels": labels})
    passes, counts, states, heard = 0, [], [], []
    while pool.pass_rows():
        passes += 1
        assert passes < 100, "the passes never ended"
        indexes = pool.pass_rows()
        inputs = pool.pass_inputs(indexes)
        served = _serve(path, [rows[i] for i in indexes], inputs)
        counts.append(turn_counts(served))
        made = _columns(served, partial=True)
        states += [t.tolist()[:2] for t in made[TURN_STATE]]
        # a row's prompt length is what its pass began from: the prompt and the response carried in
        begun = {rows[i]: p.numel() for i, p in zip(indexes, inputs["prompts"])}
        assert served.prompt_lengths == [begun[r] for r in served.rows]
        # the queue hears a cut conversation as cut, an ended one as complete (async_engine's stop counts them)
        cut = {r: bool(t[0]) for r, t in zip(served.rows, made[TURN_STATE])}
        assert all(state == (CUT if cut[r] else COMPLETE) for r, state in served.heard)
        heard += [state for _, state in served.heard]
        # the script's rows are the pool's (0 .. 5), in the order they finished
        pool.extend(list(served.rows), made["responses"], made[ROLLOUT_LOG_PROBS], passes,
                    {c: made[c] for c in PASS_COLUMNS})
    # rows really were cut, inside turns (where the turn began) and right after tool answers (-1)
    assert any(cut and start >= 0 for cut, start in states) and [1, -1] in states
    assert CUT in heard and COMPLETE in heard
    columns, metrics = pool.take(len(rows), passes)
    # every row but the short answer of row 1 took several passes
    assert metrics["partial_rollout/continued_rows"] == sum(r.numel() > 7 for r in one["responses"]) == len(rows) - 1
    for k in range(len(rows)):
        assert columns["responses"][k].tolist() == one["responses"][k].tolist(), k
        assert columns[LOSS_MASK][k].tolist() == one[LOSS_MASK][k].tolist(), k
        assert columns[ROLLOUT_LOG_PROBS][k].tolist() == one[ROLLOUT_LOG_PROBS][k].tolist(), k
        assert columns[TOOL_CALLS][k].tolist() == one[TOOL_CALLS][k].tolist(), k
    # every pass counts its own work: turns, calls and tokens add up to the one pass's, and each conversation is a
    # row (and a row with calls, and an ending) once, in the pass that ends it
    single = turn_counts(whole)
    for key, value in single.items():
        if not key.endswith("seconds"):
            assert sum(c.get(key, 0.0) for c in counts) == value, key
    assert single["multi_turn/count/turns"] > len(rows) and single["multi_turn/count/tool_calls"] > 0


def test_an_iterations_passes_add_their_counts_up_per_rank():
    from mindspeed_rl.trainer.utils.batch_metrics import sum_by_rank
    passes = [{"rank": 0.0, "multi_turn/count/turns": 3.0, "multi_turn/count/rows": 1.0},
              {"rank": 0.0, "multi_turn/count/turns": 2.0, "multi_turn/count/rows": 2.0}]
    assert sum_by_rank(passes) == [{"rank": 0.0, "multi_turn/count/turns": 5.0, "multi_turn/count/rows": 3.0}]
