"""Experience with no columns, a column's rows of mismatched shapes named by the column, and a tensor's rows
as views along its first dimension."""
import pytest
import torch

from mindspeed_rl.data.row_lists import column_parts, trans_input_to_experience


def test_no_columns_or_only_empty_ones_give_nothing():
    for given in ({}, {"skipped": None}):
        assert column_parts(given) == ([], [])
        assert trans_input_to_experience(given) == ([], [])


def test_rows_of_mismatched_shapes_are_refused_naming_their_column():
    with pytest.raises(ValueError, match=r"^column 'position_ids' row 1: shape \(2, 4\) does not match"):
        column_parts({"responses": [torch.ones(2), torch.ones(3)],
                      "position_ids": [torch.zeros(2, 3), torch.zeros(2, 4)]})


def test_a_tensor_gives_its_rows_along_the_first_dimension():
    value = torch.arange(6).view(3, 2)
    cols, lists = trans_input_to_experience({"ids": value, "one": torch.tensor([4.0, 5.0, 6.0])})
    assert cols == ["ids", "one"]
    assert [r.tolist() for r in lists[0]] == [[0, 1], [2, 3], [4, 5]]
    assert [r.dim() for r in lists[1]] == [0, 0, 0] and [float(r) for r in lists[1]] == [4.0, 5.0, 6.0]
