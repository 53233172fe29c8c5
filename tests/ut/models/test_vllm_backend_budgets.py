"""VLLMRollout under partial rollout, over the stand-in `vllm` package of test_vllm_backend_unit.py: each
request's max_tokens is its row's pass budget, and serve reports each finished row to the queue as complete
(stopped by itself) or cut (its budget ran out)."""
from types import SimpleNamespace

import torch

from mindspeed_rl.balance.rollout_queue import COMPLETE, CUT, RUNNING, Rows

from ut.models.test_vllm_backend_unit import _rollout, _spec, fake_vllm  # noqa: F401  (the fixture)

SAMPLING = SimpleNamespace(max_tokens=9, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0)


def test_a_budget_is_the_requests_max_tokens(fake_vllm):  # noqa: F811
    rollout = _rollout()
    assert rollout._params(SAMPLING, 4, 0, budget=torch.tensor([3])).max_tokens == 3
    assert type(rollout._params(SAMPLING, 4, 0, budget=torch.tensor([3])).max_tokens) is int
    assert rollout._params(SAMPLING, 4, 0).max_tokens == 9
    rollout.generate([torch.tensor([1]), torch.tensor([2])], SAMPLING, [5, 6], 0, 0, budgets=[2, 7])
    _, params, _ = rollout.llm.calls[-1]
    assert [p.max_tokens for p in params] == [2, 7]
    rollout.generate([torch.tensor([1])], SAMPLING, [5], 0, 0)
    assert [p.max_tokens for p in rollout.llm.calls[-1][1]] == [9]


class BudgetEngine:
    """A request runs until its row's natural length, its max_tokens or the engine's own limit (max_model_len),
    whichever comes first."""
    NATURAL = {7: 2, 8: 5, 9: 1, 10: 9}
    LIMIT = 2

    def __init__(self):
        self.live = {}

    def add_request(self, rid, prompt, params):
        self.live[rid] = [self.NATURAL[int(rid[3:])], params.max_tokens, []]

    def step(self):
        done = []
        for rid, (natural, budget, made) in list(self.live.items()):
            made.append(11)
            if len(made) in (natural, budget, self.LIMIT if natural > 5 else -1):
                del self.live[rid]
                reason = "stop" if len(made) == natural else "length"
                done.append(SimpleNamespace(request_id=rid, finished=True, outputs=[SimpleNamespace(
                    token_ids=list(made), logprobs=[{11: SimpleNamespace(logprob=-0.1)}] * len(made),
                    finish_reason=reason)]))
        return done


class Reports:
    def __init__(self, rows):
        self.rows, self.reports, self.drained = rows, [], False

    def request(self, want, progress):
        self.reports.append(progress())

    def poll(self, block):
        if self.rows is not None:
            rows, self.rows = self.rows, None
            return rows
        self.drained = True
        return None


def test_serve_reports_rows_that_ended_as_complete_and_rows_out_of_budget_as_cut(fake_vllm):  # noqa: F811
    rollout = _rollout()
    rollout.settings = _spec(max_num_seqs=4, logprobs=0)
    rollout.llm = SimpleNamespace(llm_engine=BudgetEngine())
    # row 7 ends at 2 within its budget 3; row 8 is cut at its budget 3; row 9 ends at 1 = its budget (EOS-like
    # stop: complete); row 10 is stopped by the engine's limit at 2, short of its budget 4 (complete: it cannot
    # go on); budgets travel as the pass's column
    budgets = [torch.tensor([b]) for b in (3, 3, 1, 4)]
    rows = Rows([0, 1, 2, 3], [7, 8, 9, 10], {"prompts": [torch.tensor([1])] * 4, "rollout_budget": budgets})
    source = Reports(rows)
    served = rollout.serve(source, SAMPLING, lambda row: row, eos_id=None, pad_id=0, chunk=None)
    assert sorted(r.numel() for r in served.responses) == [1, 2, 2, 3]
    states = {}
    for report in source.reports:
        for position, tokens, state in report:
            if state != RUNNING:
                states[position] = (tokens, state)
    assert states == {0: (2, COMPLETE), 1: (3, CUT), 2: (1, COMPLETE), 3: (2, COMPLETE)}
