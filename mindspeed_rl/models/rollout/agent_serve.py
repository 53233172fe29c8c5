"""Multi-turn rollout over the queue with a backend that generates a batch at a time (transformers generate):
each take of rows is one set of conversations, advanced turn by turn; between turns the engine waits for the
round of tool calls (the blocking loop that vLLM's continuous path, vllm_agent.py, improves on)."""
import time
from concurrent.futures import wait
from typing import List

import torch

from mindspeed_rl.agent.conversation import CUT, Conversation
from mindspeed_rl.models.rollout.results import CARRIED_TURN, ROLLOUT_BUDGET, Served
from mindspeed_rl.balance import rollout_queue


def turn_seed(seed: int, turn: int) -> int:
    """A row's sampling seed for its ``turn``-th model turn (turn 0: the row's own seed)."""
    return (int(seed) + 1_000_003 * int(turn)) % 2 ** 63


def conversations(agent, got) -> List[Conversation]:
    """The conversations of a take from the queue: new rows, or (partial rollout) rows carried from an earlier
    pass, each with its pass's budget."""
    n = len(got.ids)
    labels = got.inputs.get("labels") or [None] * n
    budgets = got.inputs.get(ROLLOUT_BUDGET)
    carried = got.inputs.get(CARRIED_TURN) or [None] * n
    return [agent.start(row, prompt, label, int(budgets[i]) if budgets is not None else None, state)
            for i, (row, prompt, label, state) in enumerate(zip(got.ids, got.inputs["prompts"], labels, carried))]


def finish(out: Served, conv: Conversation, position: int, prompt_length: int, latency: float,
           finished: List[tuple]) -> None:
    """A finished conversation (or one its pass cut) into ``out``: this pass's response, loss mask, log-probs and
    tool figures."""
    out.rows.append(conv.row)
    out.prompt_lengths.append(prompt_length)
    out.responses.append(conv.response())
    out.masks.append(conv.loss_mask())
    out.turn_stats.append(conv.stats())
    out.latency.append(latency)
    if out.log_probs is not None:
        out.log_probs.append(torch.tensor(conv.log_probs, dtype=torch.float32))
    finished.append((position, len(conv.tokens), rollout_queue.CUT if conv.stop == CUT else rollout_queue.COMPLETE))


def serve_blocking(backend, agent, source, sampling, seed_of, eos_id, pad_id, chunk, clock=time.perf_counter,
                   with_log_probs: bool = False) -> Served:
    out = Served(log_probs=[] if with_log_probs else None, masks=[], turn_stats=[])
    begin = clock()
    finished: List[tuple] = []

    def progress():
        report = list(finished)
        finished.clear()
        return report

    while True:
        source.request(chunk, progress)
        got = source.poll(block=True)
        if not got:
            break
        start = clock()
        convs = conversations(agent, got)
        where = {c.row: (p, c.prompt_length) for c, p in zip(convs, got.positions)}
        active, turn = convs, 0
        while active:
            budgets = [agent.turn_budget(c) for c in active]
            t0 = clock()
            result = backend.generate([c.next_prompt() for c in active], sampling,
                                      [turn_seed(seed_of(c.row), turn) for c in active], eos_id, pad_id, budgets)
            seconds = clock() - t0
            out.trace.append((max(r.numel() for r in result.responses), len(active),
                              sum(len(c.prompt) + len(c.tokens) for c in active), seconds))
            rounds = {}
            for i, (conv, response, budget) in enumerate(zip(active, result.responses, budgets)):
                ids = response.reshape(-1).tolist()
                ended = len(ids) < budget or (eos_id is not None and bool(ids) and ids[-1] == int(eos_id))
                lp = result.log_probs[i].tolist() if result.log_probs is not None else None
                future = agent.after_turn(conv, ids, lp, ended)
                if future is not None:
                    rounds[conv.row] = future
            t0 = clock()
            wait(list(rounds.values()), timeout=agent.round_deadline)  # nothing else to do; after_tools says a stuck one
            waited = clock() - t0
            out.tool_wait += waited
            out.tool_running += waited  # the engine idles while the round runs
            active = [c for c in active if c.row in rounds and agent.after_tools(c, rounds[c.row])]
            turn += 1
        for conv in convs:
            position, prompt_length = where[conv.row]
            finish(out, conv, position, prompt_length, clock() - start, finished)
    out.busy = clock() - begin
    return out
