"""report_inputs on its own: each check of a balance.jsonl line word for word, the defaults of a plan's optional
fields, the iteration ranges in messages, which plans are chosen, and group_rows' own checks."""
import json

import numpy as np
import pytest

from mindspeed_rl.reports.report_inputs import (ReportError, _ranges, group_rows, read_balance_file, select_plans,
                                                unbalanced_consumers)

GOOD = {"iteration": 1, "consumer": "actor_train", "loads": [3.0, 4.0], "random_loads": [2.0, 5.0]}


def _file(tmp_path, *records):
    path = tmp_path / "balance.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def _error(tmp_path, record):
    path = _file(tmp_path, record)
    with pytest.raises(ReportError) as err:
        read_balance_file(path)
    return str(err.value).replace(path, "F")


@pytest.mark.parametrize("change, message", [
    ({"loads": []}, "F line 1: loads must be a non-empty list of numbers"),
    ({"loads": 3}, "F line 1: loads must be a non-empty list of numbers"),
    ({"random_loads": {}}, "F line 1: random_loads must be a non-empty list of numbers"),
    ({"iteration": 1.5}, "F line 1: iteration must be an integer, got 1.5"),
    ({"iteration": True}, "F line 1: iteration must be an integer, got true"),
    ({"iteration": "2"}, 'F line 1: iteration must be an integer, got "2"'),
    ({"sizes": [1]}, "F line 1: sizes must be a list of 2 counts"),
    ({"sizes": "12"}, "F line 1: sizes must be a list of 2 counts"),
    ({"ranks": [0, -1]}, "F line 1: ranks must be a list of 2 DP ranks (ints >= 0)"),
    ({"ranks": [0, 1.0]}, "F line 1: ranks must be a list of 2 DP ranks (ints >= 0)"),
])
def test_each_bad_field_is_named(tmp_path, change, message):
    assert _error(tmp_path, dict(GOOD, **change)) == message


def test_every_missing_field_is_named_at_once(tmp_path):
    assert _error(tmp_path, {"consumer": "x"}) == "F line 1: missing iteration, loads, random_loads"


def test_a_file_of_markers_only_has_no_plans(tmp_path):
    path = _file(tmp_path, {"event": "resumed"})
    with pytest.raises(ReportError) as err:
        read_balance_file(path)
    assert str(err.value) == f"{path} has no balance plans"


def test_optional_fields_take_their_defaults(tmp_path):
    (plan,) = read_balance_file(_file(tmp_path, GOOD))
    assert plan == {"iteration": 1, "consumer": "actor_train", "objective": "tokens", "loads": [3.0, 4.0],
                    "random_loads": [2.0, 5.0], "sizes": [0, 0], "ranks": None, "balanced": True, "served": None,
                    "lower_bound": None, "tools": None}
    (plan,) = read_balance_file(_file(tmp_path, dict(GOOD, objective="flops", balanced=False, sizes=[2, 3],
                                                     ranks=[1, 0])))
    assert (plan["objective"], plan["balanced"], plan["sizes"], plan["ranks"]) == ("flops", False, [2, 3], [1, 0])


def test_iterations_in_messages_are_ranges():
    assert _ranges([7, 1, 3, 2, 2]) == "1-3, 7"
    assert _ranges([4]) == "4"
    assert _ranges([5, 9, 6]) == "5-6, 9"
    assert _ranges([1, 3, 5]) == "1, 3, 5"


def _plan(iteration, consumer, balanced=True):
    return dict(GOOD, iteration=iteration, consumer=consumer, balanced=balanced)


def test_the_chosen_plans_and_the_unbalanced_stages():
    plans = [_plan(1, "actor_rollout", False), _plan(1, "actor_train"), _plan(2, "actor_rollout", False),
             _plan(2, "ref_log_prob"), _plan(2, "actor_train")]
    assert [p["consumer"] for p in select_plans(plans)] == ["ref_log_prob", "actor_train"]  # the balanced ones
    assert [p["consumer"] for p in select_plans(plans, 2, "actor_rollout")] == ["actor_rollout"]
    only_random = [_plan(3, "actor_rollout", False), _plan(3, "other", False)]
    assert [p["consumer"] for p in select_plans(only_random)] == ["actor_rollout", "other"]
    assert unbalanced_consumers(plans) == ["actor_rollout"]
    assert unbalanced_consumers([_plan(1, "a"), _plan(1, "b", False), _plan(2, "b", False)]) == ["b"]


def test_a_missing_iteration_names_the_consumer_only_when_one_was_asked_for():
    plans = [_plan(1, "a"), _plan(2, "a"), _plan(3, "b"), _plan(5, "a")]
    with pytest.raises(ReportError) as err:
        select_plans(plans, 4, source="S")
    assert str(err.value) == "no plans for iteration 4 in S; iterations: 1-3, 5"
    with pytest.raises(ReportError) as err:
        select_plans(plans, 3, "a", source="S")
    assert str(err.value) == "no plans for iteration 3 in S for consumer 'a'; iterations: 1-2, 5"


def test_group_rows_checks_its_group_size():
    assert [g.tolist() for g in group_rows(4)] == [[0], [1], [2], [3]]  # one sample per prompt by default
    assert [g.tolist() for g in group_rows(2, n_samples=1)] == [[0], [1]]
    with pytest.raises(ReportError) as err:
        group_rows(4, n_samples=0)
    assert str(err.value) == "--n-samples must be >= 1, got 0"
    with pytest.raises(ReportError) as err:
        group_rows(5, n_samples=2)
    assert str(err.value) == ("input: 5 rows are not a whole number of groups of --n-samples 2 (add prompt_id, or "
                              "use --no-group)")
    assert [g.tolist() for g in group_rows(4, n_samples=2)] == [[0, 1], [2, 3]]  # grouped by default
    assert all(isinstance(g, np.ndarray) for g in group_rows(3, n_samples=3))


def test_a_line_with_an_event_and_an_iteration_is_a_plan(tmp_path):
    plans = read_balance_file(_file(tmp_path, {"event": "resumed"}, dict(GOOD, event="note", iteration=5)))
    assert [p["iteration"] for p in plans] == [5]  # the marker is skipped, the plan that carries an event is kept
