"""The backends' queue loops over stand-in engines: vLLM's continuous batching (requests join between steps, at
most max_num_seqs live, progress reported with each take) and the chunked generate loop of transformers."""
import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mindspeed_rl.plan.rollout_spec import RolloutSpec
from mindspeed_rl.models.rollout.base import RolloutBackend, RolloutResult
from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout
from mindspeed_rl.balance.rollout_queue import COMPLETE, CUT, RUNNING, LocalSource, RolloutQueue, StopRule

LENGTHS = [5, 1, 3, 8, 2, 2, 6, 1, 4, 7]  # response tokens of row r (the stand-ins read it from the seed)


def seed_of(row):
    return 1000 + row


class StandInEngine:
    """vLLM's LLMEngine as the loop uses it: add_request, and step() -> the requests that finished in it."""

    def __init__(self, cap):
        self.cap, self.live, self.most = cap, {}, 0

    def add_request(self, rid, prompt, params):
        assert rid not in self.live
        self.live[rid] = [LENGTHS[params - 1000], []]
        self.most = max(self.most, len(self.live))
        assert len(self.live) <= self.cap, "the loop admitted more than max_num_seqs"

    def step(self):
        done = []
        for rid, entry in list(self.live.items()):
            entry[1].append(7)
            if len(entry[1]) == entry[0]:
                del self.live[rid]
                out = SimpleNamespace(token_ids=list(entry[1]), finish_reason="stop",
                                      logprobs=[{7: SimpleNamespace(logprob=-0.25)} for _ in entry[1]])
                done.append(SimpleNamespace(request_id=rid, finished=True, outputs=[out]))
        return done


def _vllm(cap):
    rollout = VLLMRollout.__new__(VLLMRollout)  # the loop only: no engine is built
    rollout.settings = RolloutSpec("vllm", "test", max_num_seqs=cap, logprobs=0)
    rollout.stale = False
    rollout.llm = SimpleNamespace(llm_engine=StandInEngine(cap))
    rollout._params = lambda sampling, seed, eos_id, budget=None: seed
    return rollout


class Reporting(LocalSource):
    """Keeps what every take reported, and the tokens each running row had made by then."""

    def __init__(self, *args):
        super().__init__(*args)
        self.reports, self.engine = [], None

    def request(self, want, progress=None):
        if not self.waiting and not self.drained and want > 0 and progress:
            def kept():
                report = progress()
                made = {int(rid[3:]) - 100: len(entry[1]) for rid, entry in self.engine.live.items()}
                self.reports.append((list(report), made))
                return report
            return super().request(want, kept)
        return super().request(want, progress)


def _source(queue, consumer=0, cls=LocalSource):
    prompts = [torch.arange(r % 3 + 2) for r in range(len(LENGTHS))]
    return cls(queue, consumer, [100 + r for r in range(len(LENGTHS))], {"prompts": prompts})


def test_vllm_keeps_at_most_max_num_seqs_live_and_serves_every_row_once():
    rollout, queue = _vllm(cap=3), RolloutQueue()
    rows = len(LENGTHS)
    queue.load(1, rows, 1, groups=np.arange(rows) // 2)
    clock = itertools.count()
    served = rollout.serve(_source(queue), None, lambda row: seed_of(row - 100), None, None, 4,
                           clock=lambda: float(next(clock)))
    assert sorted(served.rows) == [100 + r for r in range(rows)]
    assert rollout.llm.llm_engine.most == 3 and queue.left == 0
    for row, response, log_probs in zip(served.rows, served.responses, served.log_probs):
        assert response.numel() == LENGTHS[row - 100] and log_probs.tolist() == [-0.25] * response.numel()
    assert served.prompt_lengths == [(row - 100) % 3 + 2 for row in served.rows]
    # one record per engine step: the step count is the busiest schedule's, every row's tokens made once
    trace = served.trace_array()
    assert (trace[:, 0] == 1).all() and trace[:, 1].max() == 3
    assert trace[:, 1].sum() == sum(LENGTHS)
    assert trace[:, 2].sum() == sum(served.prompt_lengths)  # every prompt's tokens enter once
    assert served.busy > 0 and all(x > 0 for x in served.latency)


def test_vllm_reports_its_rows_progress_with_each_take():
    rollout, queue = _vllm(cap=2), RolloutQueue()
    queue.load(1, len(LENGTHS), 1)
    source = _source(queue, cls=Reporting)
    source.engine = rollout.llm.llm_engine
    served = rollout.serve(source, None, lambda row: seed_of(row - 100), None, None, 4)
    running = finished = 0
    for report, made in source.reports:
        for position, tokens, state in report:
            if position in made:  # a running row: the tokens it has made so far
                assert tokens == made[position] and state == RUNNING
                running += 1
            else:  # a row that finished since the last take: its length; it stopped by itself (EOS)
                assert tokens == LENGTHS[position] and state == COMPLETE
                finished += 1
        assert set(made) <= {p for p, _, _ in report}  # every running row is reported
    assert running > 0 and finished > 0 and sorted(served.rows) == list(range(100, 110))


class StandInGenerate(RolloutBackend):
    def __init__(self):
        self.calls = []

    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
        self.calls.append(list(seeds))
        return RolloutResult([torch.ones(LENGTHS[s - 1000], dtype=torch.int32) for s in seeds])


def test_generate_runs_one_batch_per_chunk_seeded_by_its_rows():
    backend, queue = StandInGenerate(), RolloutQueue()
    queue.load(1, len(LENGTHS), 1, chunk=4)
    clock = iter([0.0, 1.0, 3.0, 3.0, 4.0, 4.0, 6.0, 9.0])
    served = backend.serve(_source(queue), None, lambda row: seed_of(row - 100), None, None, 4,
                           clock=lambda: next(clock))
    assert backend.calls == [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007], [1008, 1009]]
    assert served.rows == [100 + r for r in range(len(LENGTHS))] and served.log_probs is None
    # (longest response, rows, rows x widest prompt, seconds) per generate
    assert served.trace == [(8, 4, 16, 2.0), (6, 4, 16, 1.0), (7, 2, 8, 2.0)]
    assert served.latency == [2.0] * 4 + [1.0] * 4 + [2.0] * 2 and served.busy == 9.0


def test_a_drained_queue_serves_nothing():
    for backend in (StandInGenerate(), _vllm(2)):
        queue = RolloutQueue()
        queue.load(1, 1, 2, chunk=None if isinstance(backend, VLLMRollout) else 1)
        queue.take(1, 1, 0, 1)  # the other consumer took the only row
        served = backend.serve(_source(queue, 0), None, lambda row: seed_of(row - 100), None, None, 1)
        assert served.rows == [] and served.trace == []


def test_vllm_gives_each_request_its_rows_pass_budget():
    rollout, queue = _vllm(cap=4), RolloutQueue()
    asked = {}

    def params(sampling, seed, eos_id, budget=None):
        asked[seed - 1000] = budget
        return seed
    rollout._params = params
    rows = len(LENGTHS)
    queue.load(1, rows, 1)
    prompts = [torch.arange(2) for _ in range(rows)]
    budgets = [torch.tensor([b], dtype=torch.int32) for b in range(1, rows + 1)]
    source = LocalSource(queue, 0, [100 + r for r in range(rows)], {"prompts": prompts, "rollout_budget": budgets})
    rollout.serve(source, None, lambda row: seed_of(row - 100), None, None, 4)
    assert asked == {r: r + 1 for r in range(rows)}
    served_plain = _vllm(cap=4)
    seen = []
    served_plain._params = lambda sampling, seed, eos_id, budget=None: seen.append(budget) or seed
    queue.load(2, rows, 1)
    served_plain.serve(_source(queue), None, lambda row: seed_of(row - 100), None, None, 4)
    assert seen == [None] * rows  # without the column: max_tokens


def test_generate_passes_the_chunks_budgets():
    class Recording(RolloutBackend):
        def __init__(self):
            self.budgets = []

        def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
            self.budgets.append(budgets)
            return RolloutResult([torch.ones(1, dtype=torch.int32)] * len(prompts))

    backend, queue = Recording(), RolloutQueue()
    queue.load(1, 4, 1, chunk=2)
    source = LocalSource(queue, 0, [0, 1, 2, 3], {"prompts": [torch.arange(2)] * 4,
                                                  "rollout_budget": [torch.tensor([b]) for b in (5, 6, 7, 8)]})
    backend.serve(source, None, seed_of, None, None, 2)
    assert backend.budgets == [[5, 6], [7, 8]]


EOS = 0
# row -> tokens it makes before its EOS (EOS included), and this pass's budget; rows 6 and 7 come last: the states
# of a round's last take are never reported (no take follows it)
NATURAL = {0: 3, 1: 4, 2: 6, 3: 4, 4: 2, 5: 9, 6: 1, 7: 1}
BUDGET = {0: 4, 1: 4, 2: 4, 3: 3, 4: 2, 5: 9, 6: 1, 7: 1}


def _made(row):
    """Row ``row``'s tokens under its budget, and whether it stopped by itself (its EOS within the budget)."""
    n, budget = NATURAL[row], BUDGET[row]
    if n <= budget:
        return [7] * (n - 1) + [EOS], True
    return [7] * budget, False


class BudgetEngine(StandInEngine):
    """vLLM's engine with budgets: a request stops at its EOS ('stop') or when its budget runs out ('length')."""

    def add_request(self, rid, prompt, params):
        row, budget = params
        self.live[rid] = [row, budget, 0]

    def step(self):
        done = []
        for rid, (row, budget, _) in list(self.live.items()):
            tokens, stopped = _made(row)
            del self.live[rid]
            out = SimpleNamespace(token_ids=tokens, finish_reason="stop" if stopped else "length", logprobs=None)
            done.append(SimpleNamespace(request_id=rid, finished=True, outputs=[out]))
        return done


class BudgetGenerate(RolloutBackend):
    def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
        assert budgets == [BUDGET[s - 1000] for s in seeds]
        return RolloutResult([torch.tensor(_made(s - 1000)[0], dtype=torch.int32) for s in seeds])


class States(LocalSource):
    """Keeps every state a take reported (position -> state)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.states = {}

    def request(self, want, progress=None):
        def kept():
            report = progress()
            self.states.update({p: s for p, _, s in report if s != RUNNING})
            return report
        return super().request(want, kept if progress else None)


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_a_row_that_uses_exactly_its_budget_without_an_end_token_is_cut_on_every_serve_path(backend):
    rows = len(NATURAL)
    queue = RolloutQueue()
    queue.load(1, rows, 1, chunk=2 if backend == "hf" else None)
    inputs = {"prompts": [torch.arange(2)] * rows, "rollout_budget": [torch.tensor([BUDGET[r]]) for r in range(rows)]}
    # the rows in a scattered order: position p holds row order[p]
    order = [3, 0, 5, 1, 4, 2, 6, 7]
    source = States(queue, 0, [1000 + r for r in order], dict((k, [v[r] for r in order]) for k, v in inputs.items()))
    if backend == "hf":
        served = BudgetGenerate().serve(source, None, lambda row: row, EOS, None, 2)
    else:
        rollout = _vllm(cap=2)
        rollout.llm = SimpleNamespace(llm_engine=BudgetEngine(2))
        rollout.settings = RolloutSpec("vllm", "test", max_num_seqs=2)
        rollout._params = lambda sampling, seed, eos_id, budget=None: (seed - 1000, int(budget))
        served = rollout.serve(source, None, lambda row: row, EOS, None, 2)
    states = {order[p]: s for p, s in source.states.items() if order[p] < 6}
    # rows 0 and 1 end with their EOS (row 1 exactly at its budget), row 4 too; rows 2 and 3 run out of budget
    # without one (row 3 exactly: 3 tokens of 3), and row 5's budget is its whole length with its EOS last
    assert states == {0: COMPLETE, 1: COMPLETE, 2: CUT, 3: CUT, 4: COMPLETE, 5: COMPLETE}
    for row, response in zip(served.rows, served.responses):
        assert response.tolist() == _made(row - 1000)[0]
