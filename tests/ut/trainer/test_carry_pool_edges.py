"""CarryPool at its edges: token dtypes whatever the engine returns, empty and one-token passes, a group whose
last row is the only complete one, the async stop rule, and metrics of rows that made no tokens."""
import torch

from mindspeed_rl.plan.partial_rollout import PartialSpec
from mindspeed_rl.plan.stages import ROLLOUT_BUDGET, ROLLOUT_LOG_PROBS
from mindspeed_rl.trainer.utils.carry_pool import CarryPool
from mindspeed_rl.utils.token_ids import TOKEN_DTYPE

EOS = 9


def _pool(n=2, max_tokens=6, pass_tokens=3):
    pool = CarryPool(n, max_tokens, pass_tokens, EOS)
    pool.add({"prompts": [torch.tensor([1, 2], dtype=torch.int64), torch.tensor([3], dtype=torch.int64)]})
    return pool


def test_tokens_keep_the_token_dtype_whatever_the_engine_returns():
    pool = _pool()
    first = pool.pass_inputs(pool.pass_rows())
    assert all(p.dtype == TOKEN_DTYPE for p in first["prompts"]) and first[ROLLOUT_BUDGET].dtype == torch.int32
    rows = pool.pass_rows()
    pool.extend(rows, [torch.tensor([4, 5, 6], dtype=torch.int64), torch.tensor([], dtype=torch.int64),
                       torch.tensor([EOS], dtype=torch.int64), torch.tensor([], dtype=torch.int64)],
                [torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64), torch.zeros(0), torch.tensor([-2.0]),
                 torch.zeros(0)], iteration=1)
    assert pool.pass_inputs([0])["prompts"][0].dtype == TOKEN_DTYPE
    assert pool.rows[0]["born"].dtype == torch.int64 and pool.rows[1]["born"].dtype == torch.int64
    columns, metrics = pool.take(1, iteration=1)  # group 1: an EOS row and a row that made nothing
    assert [r.dtype for r in columns["responses"]] == [TOKEN_DTYPE] * 2
    assert [lp.dtype for lp in columns[ROLLOUT_LOG_PROBS]] == [torch.float32] * 2
    assert [r.tolist() for r in columns["responses"]] == [[EOS], []]


def test_an_empty_pass_ends_a_row_and_a_one_token_eos_ends_it_even_at_its_budget():
    pool = CarryPool(1, 4, 1, EOS)
    pool.add({"prompts": [torch.tensor([1]), torch.tensor([2])]})
    pool.extend([0, 1], [torch.tensor([], dtype=TOKEN_DTYPE), torch.tensor([EOS])], None, iteration=1)
    assert pool.complete_groups() == [0, 1]


def test_a_group_is_not_complete_while_its_first_row_runs():
    pool = CarryPool(2, 6, 3, EOS)
    pool.add({"prompts": [torch.tensor([1])]})
    pool.extend([0, 1], [torch.tensor([5, 5, 5]), torch.tensor([EOS])], None, iteration=1)
    assert pool.complete_groups() == []


def test_rows_that_made_no_tokens_have_age_zero():
    pool = CarryPool(1, 6, 3, EOS)
    pool.add({"prompts": [torch.tensor([1])]})
    pool.extend([0], [torch.tensor([], dtype=TOKEN_DTYPE)], None, iteration=3)
    _, metrics = pool.take(1, iteration=5)
    assert metrics["partial_rollout/token_age_mean"] == 0.0 and metrics["partial_rollout/token_age_max"] == 0.0


def test_the_stop_rule_counts_what_is_needed_what_ends_for_sure_and_what_must_run():
    pool = CarryPool(1, 6, 3, EOS)
    pool.add({"prompts": [torch.tensor([1]), torch.tensor([2]), torch.tensor([3]), torch.tensor([4])]})
    pool.extend([0, 1, 2], [torch.tensor([EOS]), torch.tensor([5, 5, 5]), torch.tensor([5, 5])], None, 1)
    # row 0 complete; row 1 made 3 of 6 (its next budget 3 reaches max_tokens: sure); row 2 ended short (complete)
    spec = PartialSpec(2, 6, 3, 8, async_engine=True, max_age_finished=True)
    rows = pool.pass_rows()
    assert rows == [1, 3]
    rule = pool.stop_rule(rows, spec)
    assert rule.need == 3 - 2
    assert list(rule.sure) == [True, False]  # row 3 has made nothing: 3 of 6 is not its end
    assert list(rule.must) == [True, False]  # row 1 is in its last (second) pass
    assert list(pool.stop_rule(rows, PartialSpec(3, 6, 3, 8, max_age_finished=True)).must) == [False, False]
    assert list(pool.stop_rule(rows, PartialSpec(2, 6, 3, 8, max_age_finished=False)).must) == [False, False]
    assert list(pool.stop_rule(rows, PartialSpec(1, 6, 3, 8, max_age_finished=True)).must) == [True, True]


def test_a_pool_saved_before_pools_recorded_turns_continues_as_single_turn():
    pool = _pool()
    pool.add({"prompts": [torch.tensor([1, 2], dtype=TOKEN_DTYPE)]})
    state = pool.state_dict()
    del state["turns"]  # an older checkpoint: single-turn rows only
    again = _pool()
    again.load_state_dict(state)
    assert [r["group"] for r in again.rows] == [r["group"] for r in pool.rows] and not again.turns


def test_a_rows_fields_are_its_kinds_and_no_more():
    plain = {"group", "prompt", "extra", "tokens", "log_probs", "born", "passes", "done"}
    assert set(_pool().rows[0]) == plain  # what a single-turn checkpoint holds per row
    turns = CarryPool(2, 6, 3, EOS, turns=True)
    turns.add({"prompts": [torch.tensor([1], dtype=torch.int64)]})
    assert set(turns.rows[0]) == plain | {"mask", "tool_rounds", "tool_calls", "turn_start"}
