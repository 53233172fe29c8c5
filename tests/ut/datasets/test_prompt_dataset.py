import json

import pytest

from mindspeed_rl.datasets.prompt_dataset import prompt_batches
from mindspeed_rl.models.tiny_model import build_toy_tokenizer


def test_toy_batches_change_every_step_and_are_reproducible():
    a = prompt_batches("toy:length", 4, seed=3)
    b = prompt_batches("toy:length", 4, seed=3)
    first, second = next(a), next(a)
    assert [t.tolist() for t in first["prompts"]] == [t.tolist() for t in next(b)["prompts"]]
    assert len(first["prompts"]) == len(first["labels"]) == 4
    assert [t.tolist() for t in first["prompts"]] != [t.tolist() for t in second["prompts"]]


def test_jsonl_batches_tokenize_and_cycle(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": "<bos>12<sep>", "label": "3"}, {"prompt": "<bos>4<sep>", "label": "4"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    batches = prompt_batches(str(path), 2, seed=0, tokenizer=build_toy_tokenizer())
    batch = next(batches)
    assert batch["prompts"][0].tolist() == [12, 1, 2, 15]
    assert batch["labels"][1].tolist() == [4]
    assert next(batches)["prompts"][1].tolist() == [12, 4, 15]


def _take(batches, count):
    return [([t.tolist() for t in b["prompts"]], [t.tolist() for t in b["labels"]]) for b in
            (next(batches) for _ in range(count))]


def test_jsonl_resume_position_is_counted_in_batches(tmp_path):
    """start=k (a run resumed after k iterations) serves batch k of the
    uninterrupted run, also past the end of the file (7 rows, 3 per batch)."""
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"<bos>{i}<sep>", "label": str(i)}) + "\n" for i in range(7)))
    tok = build_toy_tokenizer()
    fresh = _take(prompt_batches(str(path), 3, seed=0, tokenizer=tok), 6)
    assert [labels for _, labels in fresh[:3]] == [[[0], [1], [2]], [[3], [4], [5]], [[6], [0], [1]]]
    for start in (1, 2, 4):
        assert _take(prompt_batches(str(path), 3, seed=0, tokenizer=tok, start=start), 2) == fresh[start:start + 2]


def test_toy_resume_position_is_counted_in_batches():
    fresh = _take(prompt_batches("toy:length", 4, seed=3), 4)
    assert _take(prompt_batches("toy:length", 4, seed=3, start=2), 2) == fresh[2:]


@pytest.mark.parametrize("content,match", [
    ('{"prompt": "1"}\n{"prompt": "2", "label": "2"}\n', r"p.jsonl:1: each line needs 'prompt' and 'label'"),
    ('{"prompt": "1", "label": "1"}\n', "fewer than global_batch_size"),
])
def test_jsonl_errors(tmp_path, content, match):
    path = tmp_path / "p.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        next(prompt_batches(str(path), 2, seed=0, tokenizer=build_toy_tokenizer()))


def test_missing_data_path():
    with pytest.raises(ValueError, match="data_path is empty"):
        next(prompt_batches("", 2, seed=0))
    with pytest.raises(FileNotFoundError, match="neither"):
        next(prompt_batches("/no/such/file.jsonl", 2, seed=0))
