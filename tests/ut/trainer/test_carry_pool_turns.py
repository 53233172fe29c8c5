"""Partial rollout's pool in a multi-turn run: a row keeps its loss mask and conversation state beside its tokens
and log-probs, is complete once its conversation ended, trains with the multi-turn columns, saves and reloads whole,
and refuses damaged state and pools of the other kind in one line."""
import os

import pytest
import torch

from mindspeed_rl.plan.stages import (CARRIED_TURN, LOSS_MASK, ROLLOUT_BUDGET, ROLLOUT_LOG_PROBS, TOOL_CALLS,
                                            TURN_STATE)
from mindspeed_rl.trainer import partial_rollout
from mindspeed_rl.trainer.utils.carry_pool import CarryPool, state_problem

EOS = 9


def _pool(turns=True, n=1, max_tokens=20, pass_tokens=4):
    return CarryPool(n, max_tokens, pass_tokens, EOS, extra_columns=("labels",), turns=turns)


def _batch(*prompts):
    return {"prompts": [torch.tensor(p, dtype=torch.int32) for p in prompts],
            "labels": [torch.tensor([len(p)]) for p in prompts]}


def _made(masks, rounds, states):
    """A pass's multi-turn outputs: each row's mask, tool rounds and [cut, cut turn's start, calls]."""
    return {LOSS_MASK: [torch.tensor(m, dtype=torch.int8) for m in masks],
            TOOL_CALLS: [torch.tensor([r], dtype=torch.int32) for r in rounds],
            TURN_STATE: [torch.tensor(s, dtype=torch.int64) for s in states]}


def _ints(t):
    return [int(x) for x in t]


def _two_passes(pool):
    """Row 0: a turn cut at 4 tokens, then its end, a tool answer of 5 tokens (past the pass's budget: the pass
    ends there, between turns), then the final turn. Row 1: one short answer, complete at once."""
    pool.add(_batch([1, 2], [3]))
    first = pool.pass_inputs([0, 1])
    assert [_ints(c) for c in first[CARRIED_TURN]] == [[0, 0, 0, -1], [0, 0, 0, -1]]
    assert [_ints(x) for x in first["labels"]] == [[2], [1]]  # the tools' ground truth travels with the pass
    pool.extend([0, 1], [torch.tensor([4, 5, 6, 7]), torch.tensor([8, EOS])],
                [torch.full((4,), -0.1), torch.full((2,), -0.2)], 1,
                _made([[1, 1, 1, 1], [1, 1]], [0, 0], [[1, 0, 0], [0, -1, 0]]))
    assert pool.pass_rows() == [0]  # row 1 ended with fewer tokens than its budget, row 0 was cut
    second = pool.pass_inputs([0])
    assert _ints(second["prompts"][0]) == [1, 2, 4, 5, 6, 7]
    assert _ints(second[CARRIED_TURN][0]) == [4, 0, 0, 0]  # 4 tokens so far, its cut turn began at 0
    assert _ints(second[ROLLOUT_BUDGET]) == [4]
    # the rest of the turn (2 tokens), then a tool answer of 5 (7 in all, 2 of them the model's: within 4)
    pool.extend([0], [torch.tensor([10, EOS, 30, 31, 32, 33, 34])], [torch.tensor([-1.0, -1.1] + [0.0] * 5)], 2,
                _made([[1, 1, 0, 0, 0, 0, 0]], [1], [[1, -1, 1]]))
    assert pool.pass_rows() == [0] and pool.rows[0]["turn_start"] == -1
    assert _ints(pool.pass_inputs([0])[CARRIED_TURN][0]) == [11, 1, 1, -1]
    pool.extend([0], [torch.tensor([12, EOS])], [torch.tensor([-2.0, -2.1])], 3, _made([[1, 1]], [0], [[0, -1, 0]]))


def test_a_conversation_carried_over_passes_keeps_tokens_mask_and_log_probs_aligned():
    pool = _pool()
    _two_passes(pool)
    assert pool.complete_groups() == [0, 1]
    columns, metrics = pool.take(2, iteration=3)
    assert _ints(columns["responses"][0]) == [4, 5, 6, 7, 10, EOS, 30, 31, 32, 33, 34, 12, EOS]
    assert _ints(columns[LOSS_MASK][0]) == [1] * 6 + [0] * 5 + [1, 1]
    assert columns[LOSS_MASK][0].dtype == torch.int8
    assert columns[ROLLOUT_LOG_PROBS][0].tolist() == pytest.approx([-0.1] * 4 + [-1.0, -1.1] + [0.0] * 5 + [-2.0, -2.1])
    assert [_ints(x) for x in columns[TOOL_CALLS]] == [[1], [0]]  # tool rounds of the whole conversation
    assert columns[TOOL_CALLS][0].dtype == torch.int32
    assert _ints(columns[LOSS_MASK][1]) == [1, 1] and _ints(columns["response_length"]) == [13, 2]
    assert metrics["partial_rollout/continued_rows"] == 1 and metrics["partial_rollout/max_passes"] == 3


def test_a_conversation_is_complete_when_it_ended_not_by_its_token_count():
    pool = _pool()
    pool.add(_batch([1], [2]))
    # row 0 made its whole budget and ended (a turn that ran out of max_tokens); row 1 made one token and was cut
    pool.extend([0, 1], [torch.tensor([5, 5, 5, 5]), torch.tensor([6])], None, 1,
                _made([[1] * 4, [0]], [0, 1], [[0, -1, 0], [1, -1, 1]]))
    assert [r["done"] for r in pool.rows] == [True, False]
    assert not _pool(turns=False).turns  # a single-turn pool keeps its own rule (EOS, fewer tokens, max_tokens)


def test_a_pass_over_its_budget_or_with_a_bad_mask_or_state_changes_nothing():
    pool = _pool()
    pool.add(_batch([1]))
    before = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in pool.rows[0].items()}
    cases = [
        (_made([[1] * 5], [0], [[1, 0, 0]]), 5, "row 0 of the pass made 5 model tokens (5 in all), over its budget "
                                                "of 4"),
        (_made([[1, 1]], [0], [[1, 0, 0]]), 3, "row 0 of the pass has a loss mask of 2 values for 3 tokens, or not "
                                               "0/1"),
        (_made([[1, 2, 1]], [0], [[1, 0, 0]]), 3, "row 0 of the pass has a loss mask of 3 values for 3 tokens, or not"),
        (_made([[1, 1, 1]], [0], [[2, 0, 0]]), 3, "row 0 of the pass has a turn state [2, 0, 0], not [cut 0/1, turn "
                                                  "start, calls >= 0]"),
        (_made([[1, 0, 1]], [1], [[1, 1, 1]]), 3, "row 0 of the pass: its cut turn's start is 1, not where a model "
                                                  "turn of its 3-token response begins"),
        (_made([[1, 1, 1]], [0], [[0, 0, 0]]), 3, "row 0 of the pass: its cut turn's start is 0, but the row is "
                                                  "complete"),
    ]
    for made, size, message in cases:
        with pytest.raises(ValueError) as err:
            pool.extend([0], [torch.arange(size)], None, 1, made)
        assert str(err.value).startswith(f"partial rollout: {message}") and "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"a multi-turn pass needs \['loss_mask', 'tool_call_num', 'turn_state'\] "
                                         r"for each of its 1 rows"):
        pool.extend([0], [torch.arange(2)], None, 1)
    assert all(torch.equal(pool.rows[0][k], v) if isinstance(v, torch.Tensor) else pool.rows[0][k] == v
               for k, v in before.items())


def test_the_state_round_trips_through_a_checkpoint_file(tmp_path):
    pool = _pool()
    pool.add(_batch([1, 2], [3]))
    pool.extend([0, 1], [torch.tensor([4, 5, 6, 7]), torch.tensor([8, EOS])], None, 1,
                _made([[1, 1, 1, 1], [1, 1]], [0, 0], [[1, 0, 0], [0, -1, 0]]))
    path = tmp_path / "pool.pt"
    torch.save(pool.state_dict(), path)
    again = _pool()
    again.load_state_dict(torch.load(path, weights_only=True))
    assert again.pass_inputs([0])[CARRIED_TURN][0].tolist() == [4, 0, 0, 0]
    for mine, theirs in zip(pool.rows, again.rows):
        assert _ints(mine["mask"]) == _ints(theirs["mask"]) and mine["turn_start"] == theirs["turn_start"]
    # the reloaded pool goes on as the first would
    for p in (pool, again):
        p.extend([0], [torch.tensor([10, EOS])], None, 2, _made([[1, 1]], [0], [[0, -1, 0]]))
    assert [_ints(c) for c in pool.take(2, 2)[0][LOSS_MASK]] == [_ints(c) for c in again.take(2, 2)[0][LOSS_MASK]]


def _saved():
    pool = _pool()
    pool.add(_batch([1]))
    pool.extend([0], [torch.tensor([4, 5, 6, 7])], None, 1, _made([[1, 0, 1, 1]], [1], [[1, 2, 1]]))
    return pool.state_dict()


def _damage(**fields):
    state = _saved()
    state["rows"] = [dict(state["rows"][0], **fields)]
    return state


@pytest.mark.parametrize("fields,problem", [
    (dict(mask=torch.tensor([1, 0, 1, 1])), "row 0's 'mask' is a 1-D torch.int64 tensor, not a 1-D int8 tensor of 0 "
                                            "and 1"),
    (dict(mask=torch.tensor([1, 0, 1, 3], dtype=torch.int8)), "row 0's 'mask' is a tensor with values other than 0 "
                                                              "and 1, not a 1-D int8 tensor of 0 and 1"),
    (dict(mask=torch.tensor([1, 0, 1], dtype=torch.int8)), "row 0 has 4 tokens and a loss mask of 3"),
    (dict(tool_rounds=-1), "row 0's 'tool_rounds' is -1, not an int >= 0"),
    (dict(tool_calls=True), "row 0's 'tool_calls' is True, not an int >= 0"),
    (dict(turn_start=-2), "row 0's 'turn_start' is -2, not an int >= -1"),
    (dict(turn_start=1), "row 0's 'turn_start' is 1, not where a model turn of its 4-token response begins"),
    (dict(turn_start=2, done=True), "row 0's 'turn_start' is 2, but the row is complete"),
])
def test_a_damaged_mask_or_turn_state_is_one_line_naming_the_row_and_field(fields, problem):
    state = _damage(**fields)
    assert state_problem(_saved()) is None
    said = state_problem(state)
    assert said.startswith(problem) and "\n" not in said
    pool = _pool()
    with pytest.raises(ValueError, match="the pool to continue is damaged: " + problem.split(",")[0][:30]):
        pool.load_state_dict(state)
    assert pool.rows == []


def test_a_missing_turn_field_and_a_bad_turns_flag_are_named():
    state = _saved()
    del state["rows"][0]["turn_start"]
    assert state_problem(state) == "row 0 lacks 'turn_start' (a multi-turn pool's row)"
    state = dict(_saved(), turns="yes")
    assert state_problem(state) == "its 'turns' is 'yes', not true or false"


def test_a_single_turn_pool_and_a_multi_turn_one_do_not_continue_each_other():
    multi, single = _saved(), _pool(turns=False)
    single.add(_batch([1]))
    with pytest.raises(ValueError) as err:
        _pool(turns=False).load_state_dict(multi)
    assert str(err.value) == ("partial rollout: the checkpoint's pool was saved by a multi-turn run, this run is "
                              "single-turn (rl_config.multi_turn_enable must match to continue its rows)")
    old = single.state_dict()
    del old["turns"]  # a pool saved before pools said their kind is a single-turn one
    with pytest.raises(ValueError, match="saved by a single-turn run, this run is multi-turn"):
        _pool().load_state_dict(old)


def test_a_pool_of_the_other_kind_is_refused_by_its_run_before_loading(tmp_path):
    state = dict(_saved(), rollout_passes=1, run={"rl_config.multi_turn_enable": True, "rl_config.seed": 1})
    torch.save(state, os.path.join(tmp_path, partial_rollout.POOL_FILE))
    with pytest.raises(ValueError) as err:
        partial_rollout.read_pool(str(tmp_path), {"rl_config.multi_turn_enable": False, "rl_config.seed": 1})
    line = str(err.value)
    assert "belongs to another run: its rl_config.multi_turn_enable=True, this run's False" in line
    assert "\n" not in line
    assert partial_rollout.read_pool(str(tmp_path), {"rl_config.multi_turn_enable": True})["turns"] is True
