import numpy as np
import pytest
import torch

from mindspeed_rl.data.row_lists import column_parts, trans_input_to_experience

PAD = -1


def _rows():
    ints = [torch.arange(1, n + 1, dtype=torch.int32) * 10 for n in (3, 5, 1)]
    floats = [torch.full((n,), 0.5 * (i + 1)) for i, n in enumerate((2, 6, 4))]
    pos = [torch.stack([torch.arange(n, dtype=torch.int32)] * 3) for n in (3, 5, 1)]
    return {
        "responses": ints,
        "old_log_prob": floats,
        "position_ids": pos,
        "prompt_length": [torch.tensor([7], dtype=torch.int32), torch.tensor([2], dtype=torch.int32),
                          torch.tensor([4], dtype=torch.int32)],
        "response_length": [torch.tensor([3.0]), torch.tensor([5.0]), torch.tensor([1.0])],
    }


# trans_input_to_experience

def test_trans_splits_tensor_and_keeps_dtypes():
    prompts = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)
    masks = [torch.tensor([1], dtype=torch.int64), torch.tensor([1.0, 0.0])]
    cols, lists = trans_input_to_experience({"prompts": prompts, "skip": None, "mask": masks})
    assert cols == ["prompts", "mask"]
    assert [r.tolist() for r in lists[0]] == [[1, 2], [3, 4]]
    assert all(r.dtype == torch.int64 for r in lists[0])  # nothing narrows: the sources give int32 ids
    assert lists[1][0].dtype == torch.int64 and lists[1][1].dtype == torch.float32


def test_column_parts_take_a_tensor_as_one_buffer():
    adv = torch.tensor([0.5, -1.0, 2.0])
    ids = torch.arange(6, dtype=torch.int32).view(3, 2)
    cols, parts = column_parts({"advantages": adv, "skip": None, "ids": ids,
                                "rows": [torch.ones(1), torch.ones(3), torch.ones(2)]})
    assert cols == ["advantages", "ids", "rows"]
    (flat, lengths, trailing), (iflat, ilengths, itrailing), (_, rlengths, _) = parts
    assert flat.data_ptr() == adv.data_ptr() and trailing is None and lengths.tolist() == [1, 1, 1]
    assert iflat.dtype == torch.int32 and ilengths.tolist() == [2, 2, 2] and itrailing == ()
    assert rlengths.tolist() == [1, 3, 2]
    with pytest.raises(ValueError, match="'b' has 3 rows.*'a' has 2"):
        column_parts({"a": torch.zeros(2), "b": [torch.zeros(1)] * 3})
    with pytest.raises(ValueError, match="'s'.*Tensor"):
        column_parts({"s": torch.tensor(3)})


def test_trans_rejects_unsupported_type():
    with pytest.raises(ValueError, match="'prompts'.*ndarray"):
        trans_input_to_experience({"prompts": np.zeros((2, 2))})
    with pytest.raises(ValueError, match="'mask'.*list"):
        trans_input_to_experience({"mask": [[1, 2], [3]]})
    with pytest.raises(ValueError, match="'s'.*Tensor"):
        trans_input_to_experience({"s": torch.tensor(3)})


def test_trans_rejects_row_count_mismatch():
    with pytest.raises(ValueError, match="'b' has 3 rows.*'a' has 2"):
        trans_input_to_experience({"a": torch.zeros(2, 4), "b": [torch.zeros(1)] * 3})
