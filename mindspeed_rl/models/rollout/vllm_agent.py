"""Multi-turn rollout on vLLM's continuous batching: every model turn is a request; a turn that makes tool calls
leaves the engine while its round runs beside it (agent/tool_runner.py), and the conversation's next turn joins
the running engine between steps once the answers are in. The engine keeps stepping the other rows and keeps
taking rows from the queue meanwhile, so it waits only when every row it holds is waiting on a tool.

Routing of the next turn: sticky (the engine that ran the conversation's earlier turns runs the next) unless the
queue's round hands turns off (``source.handoff``, rl_config.multi_turn_routing=free): then a conversation whose
answers are in goes back to the queue with the engine's next take, and the queue hands it to the engine running
fewest rows (balance/rollout_queue.py), which prefills its prompt and response so far."""
import time
from concurrent.futures import FIRST_COMPLETED, wait
from typing import Dict, List, Tuple

from mindspeed_rl.agent.conversation import Conversation
from mindspeed_rl.models.rollout.agent_serve import conversations, finish, turn_seed
from mindspeed_rl.models.rollout.results import Served
from mindspeed_rl.balance.rollout_queue import RUNNING, WAITING

IDLE_POLL = 0.005  # seconds between asks of an engine with nothing to run while other engines hold conversations
TURN_POLL = 0.02   # free routing, no fresh rows left: seconds between asks of a running engine for handed turns


def serve_conversations(backend, agent, source, sampling, seed_of, eos_id, clock=time.perf_counter) -> Served:
    engine, cap = backend.llm.llm_engine, backend.settings.max_num_seqs
    out = Served(log_probs=[] if backend.settings.returns_log_probs else None, masks=[], turn_stats=[])
    live: Dict[str, list] = {}      # request id -> [conversation, turn budget]
    waiting: Dict[int, tuple] = {}  # row -> (conversation, the future of its tool round)
    meta: Dict[int, list] = {}      # row -> [position, prompt length, admitted at (s), turns]
    finished: List[Tuple[int, int, int]] = []
    outbox: List[tuple] = []  # free routing: (position, state) of conversations to hand back with the next take
    prefill, begin = 0, clock()
    consumer = source.consumer
    asked = clock()

    def progress():
        report = [(meta[c.row][0], len(c.tokens), RUNNING) for c, _ in live.values()]
        report += [(meta[row][0], len(c.tokens), WAITING) for row, (c, _) in waiting.items()] + finished
        finished.clear()
        return report

    def hand_back(conv: Conversation) -> None:
        position, prompt_length, admitted, turn = meta.pop(conv.row)
        outbox.append((position, (conv, prompt_length, clock() - admitted, time.time(), turn)))

    def take_over(position: int, state: tuple) -> int:
        conv, prompt_length, age, sent, turn = state  # its age so far plus the time it spent in the queue
        meta[conv.row] = [position, prompt_length, clock() - age - max(time.time() - sent, 0.0), turn]
        return submit(conv)

    def submit(conv: Conversation) -> int:
        turn = meta[conv.row][3]
        budget = agent.turn_budget(conv)
        rid = f"row{conv.row}t{turn}"
        if conv.engine is not None and conv.engine != consumer:
            conv.moved += 1
        conv.engine = consumer
        prompt = conv.next_prompt()
        engine.add_request(rid, {"prompt_token_ids": prompt.tolist()},
                           backend._params(sampling, turn_seed(seed_of(conv.row), turn), eos_id, budget))
        live[rid] = [conv, budget]
        meta[conv.row][3] += 1
        return prompt.numel()

    def done(conv: Conversation) -> None:
        position, prompt_length, admitted = meta.pop(conv.row)[:3]
        finish(out, conv, position, prompt_length, clock() - admitted, finished)

    while True:
        # a conversation waiting on its tool holds no slot; with free routing and no fresh rows left, a running
        # engine asks for other engines' turns only every TURN_POLL (each ask is a call to the queue)
        room = len(live) < cap and (not source.handoff or getattr(source, "fresh", 1) > 0 or not live
                                    or clock() - asked >= TURN_POLL)
        if (room or outbox) and source.request(cap - len(live), progress, outbox):
            outbox, asked = [], clock()
        got = source.poll(block=not live and not waiting)
        if got:
            now = clock()
            for row, position, conv in zip(got.ids, got.positions, conversations(agent, got)):
                meta[row] = [position, conv.prompt_length, now, 0]
                prefill += submit(conv)
            for position, state in got.turns:  # free routing: turns of conversations other engines began
                prefill += take_over(position, state)
        for row in [r for r, (_, f) in waiting.items() if f.done()]:  # answers in: the next turn joins
            conv, future = waiting.pop(row)
            if not agent.after_tools(conv, future):
                done(conv)
            elif source.handoff:
                hand_back(conv)
            else:
                prefill += submit(conv)
        if not live:
            if waiting:  # every row this engine holds waits on a tool
                start = clock()
                wait([f for _, f in waiting.values()], timeout=1.0, return_when=FIRST_COMPLETED)
                waited = clock() - start
                out.tool_wait += waited
                out.tool_running += waited
                continue
            if source.drained:
                break
            if got is not None and not got and not outbox:  # others still hold conversations: ask again soon
                time.sleep(IDLE_POLL)
            continue
        count, start = len(live), clock()
        outputs = [o for o in engine.step() if o.finished]
        end = clock()
        if waiting:  # the engine steps other rows while these wait on their tools
            out.tool_running += end - start
            out.tool_busy += end - start
        out.trace.append((1, count, prefill, end - start))
        prefill = 0
        for output in outputs:
            conv, budget = live.pop(output.request_id)
            response, log_probs = backend._response(output)
            ids = response.tolist()
            ended = output.outputs[0].finish_reason == "stop" or len(ids) < int(budget)
            future = agent.after_turn(conv, ids, log_probs.tolist() if log_probs is not None else None, ended)
            if future is None:
                done(conv)
            else:
                waiting[conv.row] = (conv, future)
    out.busy = clock() - begin
    return out
