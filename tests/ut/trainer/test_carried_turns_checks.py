"""The checks of a multi-turn pool's rows and of what a pass made for them (trainer/utils/carried_turns.py): the
message names the row and the field, each bound at its edge."""
import torch

from mindspeed_rl.plan.stages import LOSS_MASK, TOOL_CALLS, TURN_STATE
from mindspeed_rl.trainer.utils.carried_turns import apply_pass, pass_problem, row_problem


def _row(mask, start=-1, done=False, tokens=None):
    mask = torch.tensor(mask, dtype=torch.int8) if isinstance(mask, list) else mask
    n = mask.numel() if isinstance(mask, torch.Tensor) else 2
    return {"tokens": torch.arange(n) if tokens is None else tokens, "mask": mask, "tool_rounds": 0,
            "tool_calls": 0, "turn_start": start, "done": done}


def test_a_mask_that_is_no_tensor_is_named():
    row = _row([1, 0])
    row["mask"] = [1, 0]
    assert row_problem(3, row) == "row 3's 'mask' is [1, 0], not a 1-D int8 tensor of 0 and 1"


def test_a_cut_turns_start_must_begin_the_models_last_turn():
    # a start whose tokens are not all the model's, right at the response's start
    assert row_problem(0, _row([1, 0, 1], start=0)) == (
        "row 0's 'turn_start' is 0, not where a model turn of its 3-token response begins (the turn's tokens are "
        "the model's and end the response, a tool answer or the start comes before)")
    # a start at the response's end (no turn there), after a tool token
    assert "is 2, not where a model turn of its 2-token response begins" in row_problem(0, _row([1, 0], start=2))
    assert row_problem(0, _row([1, 0, 1, 1], start=2)) is None


def _made(mask, cut=1, start=-1, calls=0, rounds=0, dtype=torch.int8):
    return {LOSS_MASK: torch.tensor(mask, dtype=dtype), TURN_STATE: torch.tensor([cut, start, calls]),
            TOOL_CALLS: torch.tensor([rounds], dtype=torch.int32)}


def test_a_pass_may_fill_the_row_to_its_limit_but_not_past_it():
    row = _row([1, 1])
    assert pass_problem(0, row, torch.arange(3), _made([1, 1, 1]), budget=3, max_tokens=5) is None
    assert pass_problem(0, row, torch.arange(4), _made([1, 1, 0, 0]), budget=3, max_tokens=5) == (
        "row 0 of the pass made 2 model tokens (4 in all), over its budget of 3 or the row's 5")


def test_a_pass_with_negative_calls_in_its_turn_state_is_refused():
    problem = pass_problem(1, _row([1]), torch.arange(1), _made([1], cut=0, calls=-1), budget=4, max_tokens=9)
    assert problem == "row 1 of the pass has a turn state [0, -1, -1], not [cut 0/1, turn start, calls >= 0]"


def test_a_pass_mask_of_another_int_type_is_kept_as_int8():
    row = _row([1])
    assert apply_pass(row, _made([0, 1], cut=0, calls=2, rounds=1, dtype=torch.int64)) is True
    assert row["mask"].dtype == torch.int8 and row["mask"].tolist() == [1, 0, 1]
    assert (row["tool_rounds"], row["tool_calls"], row["turn_start"]) == (1, 2, -1)
