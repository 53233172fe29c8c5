"""Partial rollout's pool: a carried row continues exactly where it stopped, budgets, completion, order, state."""
import pytest
import torch

from mindspeed_rl.plan.stages import ROLLOUT_BUDGET, ROLLOUT_LOG_PROBS
from mindspeed_rl.trainer.utils.carry_pool import CarryPool

EOS = 9


def _pool(n=2, max_tokens=6, pass_tokens=3):
    return CarryPool(n, max_tokens, pass_tokens, EOS, extra_columns=("labels",))


def _batch(*prompts):
    return {"prompts": [torch.tensor(p, dtype=torch.int32) for p in prompts],
            "labels": [torch.tensor([len(p)]) for p in prompts]}


def _ints(t):
    return [int(x) for x in t]


def test_a_carried_row_continues_from_its_prefix_and_keeps_its_log_probs():
    pool = _pool()
    pool.add(_batch([1, 2], [3]))
    rows = pool.pass_rows()
    assert rows == [0, 1, 2, 3]
    first = pool.pass_inputs(rows)
    assert [_ints(p) for p in first["prompts"]] == [[1, 2], [1, 2], [3], [3]]
    assert _ints(first[ROLLOUT_BUDGET]) == [3, 3, 3, 3]
    # row 0 is cut at its budget, row 1 ends with EOS, rows 2-3 stop early (the engine ended them)
    pool.extend(rows, [torch.tensor([4, 5, 6]), torch.tensor([7, EOS]), torch.tensor([8]), torch.tensor([8, 8])],
                [torch.tensor([-0.1, -0.2, -0.3]), torch.tensor([-0.4, -0.5]), torch.tensor([-0.6]),
                 torch.tensor([-0.7, -0.8])], iteration=1)
    assert pool.pass_rows() == [0]
    second = pool.pass_inputs([0])
    assert _ints(second["prompts"][0]) == [1, 2, 4, 5, 6]  # the prompt and every token so far, unchanged
    assert _ints(second["prompt_length"]) == [5]
    assert _ints(second[ROLLOUT_BUDGET]) == [3]
    pool.extend([0], [torch.tensor([10, 11, 12])], [torch.tensor([-1.0, -1.1, -1.2])], iteration=2)
    assert pool.complete_groups() == [0, 1]  # row 0 reached max_tokens=6
    columns, metrics = pool.take(2, iteration=2)
    assert _ints(columns["responses"][0]) == [4, 5, 6, 10, 11, 12]
    assert columns[ROLLOUT_LOG_PROBS][0].tolist() == pytest.approx([-0.1, -0.2, -0.3, -1.0, -1.1, -1.2])
    assert _ints(columns["response_length"]) == [6, 2, 1, 2]
    assert _ints(columns["prompt_length"]) == [2, 2, 1, 1]
    assert [_ints(x) for x in columns["labels"]] == [[2], [2], [1], [1]]
    assert metrics["partial_rollout/continued_rows"] == 1
    assert metrics["partial_rollout/continued_tokens"] == 3 + 2 + 1 + 2  # sampled in iteration 1, trained in 2
    assert metrics["partial_rollout/token_age_max"] == 1
    assert metrics["partial_rollout/token_age_mean"] == pytest.approx(8 / 11)
    assert metrics["partial_rollout/max_passes"] == 2
    assert pool.rows == [] and pool.groups == 0


def test_the_last_pass_budget_stops_at_max_tokens_so_a_row_ends_within_n_passes():
    pool = _pool(n=1, max_tokens=7, pass_tokens=3)  # N = 3: 3 + 3 + 1
    pool.add(_batch([1]))
    budgets = []
    for it in range(1, 4):
        assert pool.complete_groups() == []
        budget = int(pool.pass_inputs([0])[ROLLOUT_BUDGET][0])
        budgets.append(budget)
        pool.extend([0], [torch.full((budget,), 2)], None, iteration=it)
    assert budgets == [3, 3, 1] and pool.complete_groups() == [0]
    assert pool.rows[0]["passes"] == 3


def test_a_group_trains_only_when_every_sample_is_complete_and_the_oldest_go_first():
    pool = _pool(n=2)
    pool.add(_batch([1], [2], [3]))  # groups 0, 1, 2
    rows = pool.pass_rows()
    ends = {0: True, 1: False, 2: True, 3: True, 4: True, 5: True}  # group 0's second row runs on
    pool.extend(rows, [torch.tensor([EOS]) if ends[i] else torch.tensor([5, 5, 5]) for i in rows], None, 1)
    assert pool.complete_groups() == [1, 2]
    assert pool.pass_rows() == [1]
    with pytest.raises(ValueError, match="2 complete groups, 3 wanted"):
        pool.take(3, iteration=1)
    columns, metrics = pool.take(1, iteration=1)
    assert [_ints(p) for p in columns["prompts"]] == [[2], [2]]  # group 1: the oldest complete
    assert metrics["partial_rollout/carried_rows"] == 1 and metrics["partial_rollout/carried_tokens"] == 3
    assert metrics["partial_rollout/waiting_complete_rows"] == 3  # group 0's done row and group 2
    pool.add(_batch([4]))
    groups, prior = pool.pass_groups(pool.pass_rows())
    assert groups == [0, 1, 1] and prior[0] == 6 + 3 and prior[1:] == [0.0, 0.0]  # the carried row first


def test_a_bad_pass_changes_nothing():
    pool = _pool()
    pool.add(_batch([1]))
    rows = pool.pass_rows()
    before = [dict(r) for r in pool.rows]
    with pytest.raises(ValueError, match="over its budget of 3"):
        pool.extend(rows, [torch.tensor([1]), torch.tensor([1, 2, 3, 4])], None, 1)
    with pytest.raises(ValueError, match="1 log-probs for 2 tokens"):
        pool.extend(rows, [torch.tensor([1, 2]), torch.tensor([1])], [torch.tensor([0.0]), torch.tensor([0.0])], 1)
    with pytest.raises(ValueError, match="1 responses for 2 rows"):
        pool.extend(rows, [torch.tensor([1])], None, 1)
    assert all(a["tokens"].numel() == 0 and a["passes"] == b["passes"] for a, b in zip(pool.rows, before))
    with pytest.raises(ValueError, match="'labels' has 1 rows, prompts have 2"):
        pool.add({"prompts": [torch.tensor([1]), torch.tensor([2])], "labels": [torch.tensor([1])]})


def test_state_round_trips_and_refuses_another_shape():
    pool = _pool()
    pool.add(_batch([1, 2]))
    pool.extend(pool.pass_rows(), [torch.tensor([3, 4, 5]), torch.tensor([EOS])], None, 4)
    again = _pool()
    again.load_state_dict(pool.state_dict())
    assert again.next_group == 1 and again.pass_rows() == [0]
    assert _ints(again.pass_inputs([0])["prompts"][0]) == [1, 2, 3, 4, 5]
    assert again.rows[0]["born"].tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match="pass_tokens=3, this run 2"):
        _pool(pass_tokens=2).load_state_dict(pool.state_dict())
