import numpy as np
import pytest
import torch

from mindspeed_rl.trainer.utils.experience_packing import (
    pack_experience_columns,
    pad_experience,
    trans_input_to_experience,
    unpack_pad_experience,
)

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

def test_trans_splits_tensor_and_narrows_int64():
    prompts = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)
    masks = [torch.tensor([1], dtype=torch.int64), torch.tensor([1.0, 0.0])]
    cols, lists = trans_input_to_experience({"prompts": prompts, "skip": None, "mask": masks})
    assert cols == ["prompts", "mask"]
    assert [r.tolist() for r in lists[0]] == [[1, 2], [3, 4]]
    assert all(r.dtype == torch.int32 for r in lists[0])
    assert lists[1][0].dtype == torch.int32
    assert lists[1][1].dtype == torch.float32


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


# pad_experience

def test_pad_experience_values_and_multiple():
    out = pad_experience(_rows(), pad_id=PAD, multiple=4)
    assert out["responses"].shape == (3, 8)
    assert out["responses"][0].tolist() == [10, 20, 30] + [PAD] * 5
    assert out["responses"].dtype == torch.int32
    assert out["old_log_prob"].shape == (3, 8)
    assert out["old_log_prob"][0].tolist() == [0.5, 0.5] + [0.0] * 6
    # position_ids ignore multiple: 2-D rows padded along last dim to 5
    assert out["position_ids"].shape == (3, 3, 5)
    assert out["position_ids"][2].tolist() == [[0, PAD, PAD, PAD, PAD]] * 3
    assert out["prompt_length"].tolist() == [[7], [2], [4]]
    assert out["response_length"].tolist() == [[3.0], [5.0], [1.0]]


def test_pad_experience_multiple_one_and_exact_fit():
    out = pad_experience({"x": [torch.ones(4), torch.ones(2)]}, pad_id=9, multiple=1)
    assert out["x"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    out = pad_experience({"x": [torch.ones(4, dtype=torch.int32)]}, pad_id=9, multiple=4)
    assert out["x"].shape == (1, 4)


def test_pad_experience_errors():
    with pytest.raises(ValueError, match="empty"):
        pad_experience({}, pad_id=0)
    with pytest.raises(ValueError, match="'x' has no rows"):
        pad_experience({"x": []}, pad_id=0)
    with pytest.raises(ValueError, match="multiple"):
        pad_experience({"x": [torch.ones(2)]}, pad_id=0, multiple=0)


# pack_experience_columns

def test_pack_concatenates_and_records_lengths():
    rows = _rows()
    data, lengths = pack_experience_columns(rows, 3)
    assert data["responses"].tolist() == [10, 20, 30, 10, 20, 30, 40, 50, 10]
    assert data["responses"].dtype == torch.int32
    assert lengths["responses"].tolist() == [3, 5, 1]
    assert lengths["responses"].dtype == torch.int32
    assert data["old_log_prob"].dtype == torch.float32
    assert data["position_ids"].shape == (3, 9)
    assert data["position_ids"][1].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0]
    assert lengths["position_ids"].tolist() == [3, 5, 1]
    assert data["prompt_length"].tolist() == [7, 2, 4]
    assert lengths["prompt_length"].tolist() == [1, 1, 1]


def test_pack_errors():
    with pytest.raises(ValueError, match="empty"):
        pack_experience_columns({}, 0)
    with pytest.raises(ValueError, match="'a' has 1 rows, expected experience_count=2"):
        pack_experience_columns({"a": [torch.ones(2)]}, 2)
    with pytest.raises(ValueError, match="'a' has no rows"):
        pack_experience_columns({"a": []}, 0)
    with pytest.raises(ValueError, match="'p'.*first dimension"):
        pack_experience_columns({"p": [torch.zeros(3, 2), torch.zeros(2, 2)]}, 2)
    with pytest.raises(ValueError, match="'p'.*all be 1-D or all be 2-D"):
        pack_experience_columns({"p": [torch.zeros(3, 2), torch.zeros(2)]}, 2)
    with pytest.raises(ValueError, match="'p'.*all be 1-D or all be 2-D"):
        pack_experience_columns({"p": [torch.zeros(1, 2, 2)]}, 1)


# unpack_pad_experience and round trips

@pytest.mark.parametrize("multiple", [1, 2, 4])
def test_round_trip_matches_pad_experience(multiple):
    rows = _rows()
    data, lengths = pack_experience_columns(rows, 3)
    got = unpack_pad_experience(data, lengths, PAD, multiple)
    want = pad_experience(rows, PAD, multiple)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key].dtype == want[key].dtype, key
        assert torch.equal(got[key], want[key]), key


def test_round_trip_from_trans_input():
    src = {
        "prompts": torch.tensor([[5, 6, 7], [8, 9, 1]]),
        "responses": [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6])],
        "rewards": [torch.tensor([0.25]), torch.tensor([1.0, 2.0])],
        "response_length": torch.tensor([[5], [1]]),
    }
    cols, lists = trans_input_to_experience(src)
    rows = dict(zip(cols, lists))
    data, lengths = pack_experience_columns(rows, 2)
    got = unpack_pad_experience(data, lengths, pad_id=0, multiple=4)
    assert got["prompts"].tolist() == [[5, 6, 7, 0], [8, 9, 1, 0]]
    assert got["responses"].tolist() == [[1, 2, 3, 4, 5, 0, 0, 0], [6, 0, 0, 0, 0, 0, 0, 0]]
    assert got["rewards"].tolist() == [[0.25, 0, 0, 0], [1.0, 2.0, 0, 0]]
    assert got["response_length"].tolist() == [[5], [1]]
    assert got["response_length"].dtype == torch.int32
    for key, value in pad_experience(rows, 0, 4).items():
        assert torch.equal(got[key], value)


def test_unpack_keeps_device():
    data, lengths = pack_experience_columns({"x": [torch.ones(2), torch.ones(3)]}, 2)
    data = {k: v.to("meta") for k, v in data.items()}
    out = unpack_pad_experience(data, lengths, 0, 2)
    assert out["x"].device.type == "meta"
    assert out["x"].shape == (2, 4)


def test_unpack_errors():
    data, lengths = pack_experience_columns({"x": [torch.ones(2), torch.ones(3)]}, 2)
    with pytest.raises(ValueError, match="empty"):
        unpack_pad_experience({}, {}, 0, 1)
    with pytest.raises(ValueError, match="do not match"):
        unpack_pad_experience(data, {"y": lengths["x"]}, 0, 1)
    with pytest.raises(ValueError, match="'x': lengths sum to 6 but packed data has 5"):
        unpack_pad_experience(data, {"x": torch.tensor([3, 3])}, 0, 1)
    with pytest.raises(ValueError, match="multiple"):
        unpack_pad_experience(data, lengths, 0, -2)
