import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mindspeed_rl.datasets.data_order import epoch_order
from mindspeed_rl.datasets.options import data_options
from mindspeed_rl.datasets.preprocess import preprocess
from mindspeed_rl.datasets.prompt_dataset import prompt_batches
from mindspeed_rl.models.tiny_text_tokenizer import build_text_tokenizer, save_text_tokenizer

ROOT = Path(__file__).resolve().parents[3]
MAP = {"prompt": "problem", "response": "answer"}
ROWS = [{"problem": f"p{i:02d}", "answer": str(i)} for i in range(10)]


def _jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _ids(batch):
    return [[t.tolist() for t in batch["prompts"]], [t.tolist() for t in batch["labels"]]]


def _take(batches, n):
    return [_ids(next(batches)) for _ in range(n)]


def _answers(batch):
    return [bytes(t.tolist()).decode() for t in batch["labels"]]


def _batches(path, batch_size=4, seed=0, start=0, **options):
    options = {"map_keys": MAP, "prompt_type": "empty", **options}
    return prompt_batches(str(path), batch_size, seed, build_text_tokenizer(), start=start, **options)


# ---------------------------------------------------------------- file formats

def test_jsonl_parquet_json_and_folder_give_the_same_batches(tmp_path):
    import pandas as pd
    jsonl = _jsonl(tmp_path / "d.jsonl")
    pd.DataFrame(ROWS).to_parquet(tmp_path / "d.parquet")
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    folder = tmp_path / "parts"
    folder.mkdir()
    pd.DataFrame(ROWS[:6]).to_parquet(folder / "a.parquet")
    pd.DataFrame(ROWS[6:]).to_parquet(folder / "b.parquet")
    expected = _take(_batches(jsonl), 5)
    for other in (tmp_path / "d.parquet", tmp_path / "d.json", folder):
        assert _take(_batches(other), 5) == expected, other
    # the text went through the template and the tokenizer
    first = next(_batches(jsonl, prompt_type="qwen"))
    assert build_text_tokenizer().decode(first["prompts"][0]).endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_r1_prompt_and_label_ids(tmp_path):
    tok = build_text_tokenizer()
    batch = next(_batches(_jsonl(tmp_path / "d.jsonl"), batch_size=10, prompt_type="qwen_r1", shuffle=False))
    assert tok.decode(batch["prompts"][3]).endswith("\\boxed{}.\np03<|im_end|>\n<|im_start|>assistant\n")
    assert batch["prompts"][3].tolist()[0] == tok.convert_tokens_to_ids("<|im_start|>")
    assert batch["labels"][3].tolist() == list(b"3")


def test_system_column_then_system_prompt_then_template_default(tmp_path):
    rows = [{"q": "a", "r": "1", "s": "own"}, {"q": "b", "r": "2", "s": ""}]
    path = _jsonl(tmp_path / "d.jsonl", rows)
    tok = build_text_tokenizer()
    keys = {"prompt": "q", "response": "r", "system": "s"}
    batch = next(_batches(path, 2, map_keys=keys, prompt_type="qwen", system_prompt="run", shuffle=False))
    assert [tok.decode(t).split("<|im_end|>")[0] for t in batch["prompts"]] == \
        ["<|im_start|>system\nown", "<|im_start|>system\nrun"]
    batch = next(_batches(path, 2, map_keys=keys, prompt_type="qwen", shuffle=False))
    assert tok.decode(batch["prompts"][1]).startswith("<|im_start|>system\nYou are a helpful assistant.")


def test_query_is_appended_to_the_prompt(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"i": "Add:", "x": "2+3", "o": "5"}])
    batch = next(_batches(path, 1, map_keys={"prompt": "i", "query": "x", "response": "o"}))
    assert bytes(batch["prompts"][0].tolist()).decode() == "Add:\n2+3"


# ---------------------------------------------------------------- errors

def test_missing_mapped_field_names_field_file_and_columns(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl")
    with pytest.raises(ValueError, match=r"map_keys\['response'\] = 'solution': no such column in '.*d.jsonl'; "
                                         r"its columns are \['problem', 'answer'\]"):
        next(_batches(path, map_keys={"prompt": "problem", "response": "solution"}))
    with pytest.raises(ValueError, match="must name the 'response' column"):
        next(_batches(path, map_keys={"prompt": "problem", "response": ""}))
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['answer'\]"):
        next(_batches(path, map_keys={"prompt": "problem", "answer": "answer"}))


def test_empty_missing_and_unknown_data(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        next(_batches(empty))
    with pytest.raises(FileNotFoundError, match="no/such.jsonl"):
        next(_batches(tmp_path / "no" / "such.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match=r"expected .json, .jsonl or .parquet"):
        next(_batches(tmp_path / "d.csv"))
    with pytest.raises(ValueError, match="unknown prompt_type 'qwenn'"):
        next(_batches(_jsonl(tmp_path / "d.jsonl"), prompt_type="qwenn"))
    with pytest.raises(ValueError, match="fewer than global_batch_size 11"):
        next(_batches(_jsonl(tmp_path / "d.jsonl"), batch_size=11))
    with pytest.raises(TypeError, match="unknown option"):
        next(_batches(_jsonl(tmp_path / "d.jsonl"), max_len=3))


# ---------------------------------------------------------------- length filter, split

def test_prompts_over_max_prompt_length_are_dropped_and_counted(tmp_path, capsys):
    rows = [{"problem": "x" * n, "answer": str(n)} for n in (1, 2, 3, 4, 5, 6, 7, 8)]
    path = _jsonl(tmp_path / "d.jsonl", rows)
    batches = _batches(path, batch_size=2, max_prompt_length=5)
    seen = {a for _ in range(10) for a in _answers(next(batches))}
    assert seen == {"1", "2", "3", "4", "5"}
    assert "dropped 3 of 8 prompts longer than max_prompt_length=5 tokens" in capsys.readouterr().out
    with pytest.raises(ValueError, match="every prompt .* is longer than max_prompt_length=0"):
        next(_batches(path, max_prompt_length=0))


def test_split_keeps_the_leading_training_share(tmp_path):
    batch = next(_batches(_jsonl(tmp_path / "d.jsonl"), batch_size=1, split="60,30,10", shuffle=False,
                          start=6))
    assert _answers(batch) == ["0"]  # 6 training rows: batch 6 starts the second epoch
    batches = _batches(_jsonl(tmp_path / "d.jsonl"), batch_size=1, split="60,30,10")
    assert {a for _ in range(30) for a in _answers(next(batches))} == {str(i) for i in range(6)}


# ---------------------------------------------------------------- order: epochs, shuffle, resume

def test_epochs_cover_the_data_each_reshuffled_with_seed_plus_epoch(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl")
    batches = _batches(path, batch_size=5, seed=7)
    epoch0 = _answers(next(batches)) + _answers(next(batches))
    epoch1 = _answers(next(batches)) + _answers(next(batches))
    assert sorted(epoch0, key=int) == sorted(epoch1, key=int) == [str(i) for i in range(10)]
    assert epoch0 == [str(i) for i in epoch_order(10, 7, 0)]
    assert epoch1 == [str(i) for i in epoch_order(10, 7 + 1, 0)]
    assert epoch0 != epoch1 and epoch0 != sorted(epoch0, key=int)
    assert _take(_batches(path, 5, seed=7), 4) == _take(_batches(path, 5, seed=7), 4)
    assert _take(_batches(path, 5, seed=8), 2) != _take(_batches(path, 5, seed=7), 2)


def test_leftover_rows_wait_for_the_next_epoch(tmp_path):
    batches = _batches(_jsonl(tmp_path / "d.jsonl"), batch_size=4, seed=3)
    epoch0 = _answers(next(batches)) + _answers(next(batches))
    assert len(set(epoch0)) == 8
    assert _answers(next(batches)) + _answers(next(batches)) == [str(i) for i in epoch_order(10, 4, 0)[:8]]


def test_no_shuffle_serves_file_order_every_epoch(tmp_path):
    batches = _batches(_jsonl(tmp_path / "d.jsonl"), batch_size=5, shuffle=False)
    order = [a for _ in range(4) for a in _answers(next(batches))]
    assert order == [str(i) for i in range(10)] * 2


@pytest.mark.parametrize("start", [1, 2, 5])
def test_start_resumes_at_the_same_batch(tmp_path, start):
    path = _jsonl(tmp_path / "d.jsonl")
    fresh = _take(_batches(path, batch_size=4, seed=11), start + 3)
    assert _take(_batches(path, batch_size=4, seed=11, start=start), 3) == fresh[start:]


# ---------------------------------------------------------------- preprocess cache

def _recipe(tmp_path, **extra):
    return {"input": _jsonl(tmp_path / "d.jsonl"), "tokenizer_name_or_path": save_text_tokenizer(tmp_path / "tok"),
            "output_prefix": str(tmp_path / "cache"), "handler_name": "R1AlpacaStyleInstructionHandler",
            "prompt_type": "qwen_r1", "map_keys": {"prompt": "problem", "query": "", "response": "answer",
                                                   "system": ""},
            "dataset_additional_keys": ["labels"], "workers": 4, **extra}


def test_preprocess_then_train_reads_the_same_ids(tmp_path, capsys):
    cache = preprocess(_recipe(tmp_path))
    raw = _take(_batches(tmp_path / "d.jsonl", 4, seed=5, prompt_type="qwen_r1"), 4)
    # a cache needs neither map_keys nor the template again; a different prompt_type is not re-applied
    assert _take(prompt_batches(cache, 4, 5, build_text_tokenizer()), 4) == raw
    assert _take(prompt_batches(cache, 4, 5, None, prompt_type="qwen", map_keys=MAP), 4) == raw
    assert "rendered with prompt_type='qwen_r1'" in capsys.readouterr().out
    meta = json.loads((Path(cache) / "mindspeed_rl_cache.json").read_text())
    assert (meta["prompt_type"], meta["num_rows"], meta["vocab_size"]) == ("qwen_r1", 10, 259)


def test_preprocess_cli_with_overrides(tmp_path):
    recipe = _recipe(tmp_path)
    (tmp_path / "r.yaml").write_text(json.dumps(dict(recipe, output_prefix="unused")))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = tmp_path / "cli_cache"
    done = subprocess.run([sys.executable, str(ROOT / "cli" / "preprocess_data.py"), "--config",
                           str(tmp_path / "r.yaml"), f"output_prefix={out}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "10 prompts" in done.stdout
    assert _take(prompt_batches(str(out), 5, 0), 2) == _take(_batches(tmp_path / "d.jsonl", 5, prompt_type="qwen_r1"), 2)
    bad = subprocess.run([sys.executable, str(ROOT / "cli" / "preprocess_data.py"), "--config",
                          str(tmp_path / "r.yaml"), "handler_name=PairwiseHandler"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and "handler_name 'PairwiseHandler' is not implemented" in bad.stderr


def test_preprocess_recipe_errors(tmp_path):
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['inputs'\]"):
        preprocess(dict(_recipe(tmp_path), inputs="x"))
    with pytest.raises(ValueError, match="only 'labels'"):
        preprocess(_recipe(tmp_path, dataset_additional_keys=["labels", "problem"]))


# ---------------------------------------------------------------- config -> options, shipped example

def test_data_options_from_the_configs():
    actor = SimpleNamespace(map_keys={"prompt": "problem", "response": "answer"}, prompt_type="qwen_r1",
                            system_prompt=None, split="98,2,0", no_shuffle=True)
    options = data_options(actor, SimpleNamespace(max_prompt_length=640))
    assert options == {"map_keys": {"prompt": "problem", "response": "answer"}, "prompt_type": "qwen_r1",
                       "system_prompt": None, "split": "98,2,0", "shuffle": False, "max_prompt_length": 640}


def test_shipped_math_config_reads_the_shipped_data(monkeypatch):
    from transformers import AutoTokenizer
    from mindspeed_rl.plan.loader import build_configs, load_config
    monkeypatch.chdir(ROOT)
    cfgs = build_configs(load_config("configs/grpo_math_cpu.yaml", []))
    actor, rl = cfgs.actor_config, cfgs.rl_config
    tok = AutoTokenizer.from_pretrained(actor.tokenizer_name_or_path)
    batch = next(prompt_batches(actor.data_path, actor.global_batch_size, rl.seed, tok,
                                **data_options(actor, rl)))
    assert len(batch["prompts"]) == actor.global_batch_size
    assert all(len(p) <= rl.max_prompt_length for p in batch["prompts"])
    assert tok.decode(batch["prompts"][0]).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert all(tok.decode(label).isdigit() for label in batch["labels"])
    assert max(max(p.tolist()) for p in batch["prompts"]) < actor.padded_vocab_size


def test_shipped_math_data_is_what_the_generator_writes(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_math_dataset
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rows = [json.loads(line) for line in (ROOT / "data" / "math_word_problems.jsonl").read_text().splitlines()]
    assert rows == make_math_dataset.make_rows()
    assert len(rows) == 300 and all(set(r) == {"problem", "answer"} for r in rows)
