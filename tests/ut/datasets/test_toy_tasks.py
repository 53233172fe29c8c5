import pytest
import torch

from mindspeed_rl.utils.token_ids import TOKEN_DTYPE
from mindspeed_rl.datasets.toy_tasks import TASKS, TOOL_VALUES, make_prompts
from mindspeed_rl.models.tiny_model import BOS_ID, SEP_ID


def test_tasks():
    assert TASKS == ("length", "copy", "tool")


def test_length_prompts():
    data = make_prompts("length", 400, seed=0)
    assert len(data["prompts"]) == len(data["labels"]) == 400
    seen = set()
    for prompt, label in zip(data["prompts"], data["labels"]):
        assert prompt.dtype == TOKEN_DTYPE and prompt.dim() == 1 and label.dim() == 1
        length = int(label[0])
        assert label.tolist() == [length] and 1 <= length <= 8
        assert prompt.tolist() == [BOS_ID, 15 + length, SEP_ID]
        seen.add(length)
    assert seen == set(range(1, 9))


def test_copy_prompts():
    data = make_prompts("copy", 200, seed=1)
    digits_seen = set()
    for prompt, label in zip(data["prompts"], data["labels"]):
        assert prompt.dtype == TOKEN_DTYPE and label.dtype == TOKEN_DTYPE
        assert prompt.shape == (5,) and label.shape == (3,)
        assert int(prompt[0]) == BOS_ID and int(prompt[-1]) == SEP_ID
        assert prompt[1:4].tolist() == label.tolist()
        digits_seen.update(label.tolist())
    assert digits_seen == set(range(10))


@pytest.mark.parametrize("task", TASKS)
def test_deterministic_per_seed(task):
    a, b, c = (make_prompts(task, 20, seed=s) for s in (7, 7, 8))
    assert all(torch.equal(x, y) for x, y in zip(a["prompts"], b["prompts"]))
    assert all(torch.equal(x, y) for x, y in zip(a["labels"], b["labels"]))
    # the tool task's prompts are all alike: only its labels (what the tool tells) differ by seed
    assert any(not torch.equal(x, y) for x, y in zip(a["prompts"] + a["labels"], c["prompts"] + c["labels"]))


def test_tool_prompts_tell_nothing_and_labels_cover_the_digits():
    data = make_prompts("tool", 300, seed=2)
    assert all(p.tolist() == [BOS_ID, SEP_ID] and p.dtype == TOKEN_DTYPE for p in data["prompts"])
    assert {int(label[0]) for label in data["labels"]} == set(range(TOOL_VALUES))
    assert all(label.shape == (1,) and label.dtype == TOKEN_DTYPE for label in data["labels"])


def test_labels_do_not_alias_prompts():
    data = make_prompts("copy", 1, seed=0)
    data["labels"][0][0] = 99
    assert int(data["prompts"][0][1]) != 99


def test_unknown_task():
    with pytest.raises(ValueError, match="addition"):
        make_prompts("addition", 4, seed=0)
    assert make_prompts("length", 0, seed=0) == {"prompts": [], "labels": []}
