"""The multi-turn figures (agent/metrics.py): one rank's counts from what its engine served, and the round's rates
from every rank's counts, each figure by name and value."""
import pytest
import torch

from mindspeed_rl.agent.conversation import ANSWERED, CUT, LENGTH
from mindspeed_rl.agent.metrics import turn_counts, turn_metrics
from mindspeed_rl.models.rollout.results import Served


def _stat(turns, rounds, calls, errors, timeouts, skipped, seconds, moved, stop, called):
    return {"turns": turns, "tool_rounds": rounds, "tool_calls": calls, "tool_errors": errors,
            "tool_timeouts": timeouts, "tool_skipped": skipped, "tool_seconds": seconds, "moved": moved, "stop": stop,
            "called": called, "turn_start": -1}


def test_a_ranks_counts_name_every_figure():
    stats = [_stat(3, 2, 3, 1, 1, 2, 0.5, 1, ANSWERED, True), _stat(1, 0, 0, 0, 0, 0, 0.0, 0, LENGTH, False),
             _stat(2, 1, 1, 0, 2, 1, 0.25, 1, CUT, True)]  # cut: its work counts, it is no row yet
    masks = [torch.tensor([1, 1, 0, 0, 1]), torch.tensor([1, 1]), torch.tensor([1, 0, 0])]
    served = Served(masks=masks, turn_stats=stats, tool_wait=1.5, tool_running=4.0, tool_busy=2.5, busy=9.0)
    assert turn_counts(served) == {f"multi_turn/count/{k}": v for k, v in {
        "rows": 2.0, "turns": 6.0, "tool_calls": 4.0, "tool_rounds": 3.0, "rows_with_tool_calls": 1.0,
        "tool_errors": 1.0, "tool_timeouts": 3.0, "tool_skipped": 3.0, "tool_seconds": 0.75, "turns_moved": 2.0,
        "engine_tool_wait_seconds": 1.5, "tools_running_seconds": 4.0, "engine_busy_while_tools_seconds": 2.5,
        "serve_seconds": 9.0, "tokens": 10.0, "tool_tokens": 4.0, "ended_answered": 1.0, "ended_length": 1.0}.items()}


def _counts(**values):
    return {f"multi_turn/count/{k}": float(v) for k, v in values.items()}


def test_the_rounds_figures_add_the_ranks_up_even_where_a_rank_lacks_a_count():
    full = _counts(rows=3, turns=9, tool_calls=6, rows_with_tool_calls=2, tool_errors=1, tool_timeouts=2,
                   tool_skipped=1, tool_seconds=1.5, engine_tool_wait_seconds=0.5, turns_moved=2, tool_rounds=4,
                   tokens=40, tool_tokens=10, tools_running_seconds=2.0, engine_busy_while_tools_seconds=1.0,
                   serve_seconds=8.0, ended_answered=2, ended_length=1)
    some = _counts(rows=1, turns=3, tool_calls=2)  # a rank that counted only these
    m = turn_metrics([full, some])
    assert m == pytest.approx({
        "multi_turn/turns_per_row": 12 / 4, "multi_turn/tool_calls_per_row": 8 / 4, "multi_turn/tool_call_rate": 2 / 4,
        "multi_turn/tool_errors": 1.0, "multi_turn/tool_timeouts": 2.0, "multi_turn/tool_calls_skipped": 1.0,
        "multi_turn/tool_seconds": 1.5, "multi_turn/engine_tool_wait_seconds": 0.5,
        "multi_turn/turns_moved_fraction": 2 / 4, "multi_turn/tool_token_fraction": 10 / 40,
        "multi_turn/engine_busy_while_tools": 1.0 / 2.0, "multi_turn/tool_share_of_stage": 2.0 / 8.0,
        "multi_turn/ended_answered": 2 / 4, "multi_turn/ended_length": 1 / 4})
    assert turn_metrics([some, full]) == m


def test_counts_that_are_missing_are_zero_and_small_totals_are_not_rounded_up():
    m = turn_metrics([_counts(rows=0, tools_running_seconds=0.5)])
    assert m == {"multi_turn/turns_per_row": 0.0, "multi_turn/tool_calls_per_row": 0.0, "multi_turn/tool_call_rate": 0.0,
                 "multi_turn/tool_errors": 0.0, "multi_turn/tool_timeouts": 0.0, "multi_turn/tool_calls_skipped": 0.0,
                 "multi_turn/tool_seconds": 0.0, "multi_turn/engine_tool_wait_seconds": 0.0,
                 "multi_turn/turns_moved_fraction": 0.0, "multi_turn/tool_token_fraction": 0.0,
                 "multi_turn/engine_busy_while_tools": 0.0, "multi_turn/tool_share_of_stage": 1.0}
    # no rows key at all: rates per one row; one tool round and one token count as themselves
    m = turn_metrics([_counts(turns=3, turns_moved=1, tool_rounds=1, tokens=1, tool_tokens=1)])
    assert m["multi_turn/turns_per_row"] == 3.0 and m["multi_turn/turns_moved_fraction"] == 1.0
    assert m["multi_turn/tool_token_fraction"] == 1.0
    m = turn_metrics([_counts(rows=1, turns=3, turns_moved=1, tool_rounds=1.5, tokens=1.5, tool_tokens=0.75)])
    assert m["multi_turn/turns_moved_fraction"] == pytest.approx(1 / 1.5)
    assert m["multi_turn/tool_token_fraction"] == pytest.approx(0.5)
    m = turn_metrics([_counts(rows=1.5, turns=3)])
    assert m["multi_turn/turns_per_row"] == pytest.approx(2.0)
