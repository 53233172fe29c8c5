"""Upstream's dataset recipes (configs/datasets/*.yaml, values as upstream ships them) preprocess
local files in deepscaler's and DAPO-Math-17k's shapes through cli/preprocess_data.py."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mindspeed_rl.datasets.preprocess import NO_EFFECT, USED, preprocess
from mindspeed_rl.datasets.token_cache import load_cache
from mindspeed_rl.datasets.templates import render_prompt

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER = str(ROOT / "data" / "tiny_text_tokenizer")
RECIPES = sorted((ROOT / "configs" / "datasets").glob("*.yaml"))


def _tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(TOKENIZER)


def _text(ids):
    return _tok().decode(ids)


def _cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "cli" / "preprocess_data.py"), *args], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=300)


def _recipe(name):
    return yaml.safe_load((ROOT / "configs" / "datasets" / f"{name}.yaml").read_text())


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_key_is_used_or_declared(path):
    recipe = yaml.safe_load(path.read_text())
    assert set(recipe) <= set(USED) | set(NO_EFFECT), sorted(set(recipe) - set(USED) - set(NO_EFFECT))


def test_upstream_recipes_are_shipped_with_upstream_values():
    assert {p.stem for p in RECIPES} >= {"deepscaler", "math_17k", "orca_rlhf"}
    r = _recipe("math_17k")
    assert (r["handler_name"], r["prompt_type"], r["map_keys"]["response"]) == \
        ("Math17kAlpacaStyleInstructionHandler", "empty", "reward_model")
    assert (_recipe("deepscaler")["prompt_type"], _recipe("deepscaler")["map_keys"]["prompt"]) == ("qwen_r1", "problem")


def test_deepscaler_recipe_on_a_local_file(tmp_path):
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "solution": "add"} for i in range(6)]
    (tmp_path / "deepscaler.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "data"
    done = _cli("deepscaler", f"input={tmp_path / 'deepscaler.json'}", f"tokenizer_name_or_path={TOKENIZER}",
                f"output_prefix={out}")
    assert done.returncode == 0, done.stderr
    assert "6 prompts" in done.stdout
    input_ids, labels, meta = load_cache(str(out))
    assert [_text(ids) for ids in labels] == [r["answer"] for r in rows]
    assert input_ids[3] == _tok().encode(render_prompt("What is 3 + 3?", "qwen_r1"), add_special_tokens=False)
    assert "<think>" in _text(input_ids[3]) and meta["handler_name"] == "R1AlpacaStyleInstructionHandler"


def _math17k_rows():
    return [{"data_source": "math_dapo", "ability": "MATH",
             "prompt": [{"role": "user", "content": f"Solve {i} * 3. Answer: $Answer"}],
             "reward_model": {"ground_truth": str(3 * i), "style": "rule-lean"},
             "extra_info": {"index": f"id-{i}"}} for i in range(5)]


def test_math_17k_recipe_on_a_local_parquet(tmp_path):
    import datasets
    datasets.Dataset.from_list(_math17k_rows()).to_parquet(str(tmp_path / "dapo-math-17k.parquet"))
    recipe = dict(_recipe("math_17k"), input=str(tmp_path / "dapo-math-17k.parquet"),
                  tokenizer_name_or_path=TOKENIZER, output_prefix=str(tmp_path / "data"))
    input_ids, labels, meta = load_cache(preprocess(recipe))
    assert [_text(ids) for ids in labels] == ["0", "3", "6", "9", "12"]   # reward_model.ground_truth
    assert _text(input_ids[2]) == "Solve 2 * 3. Answer: $Answer"        # the message content, template empty
    assert meta["handler_name"] == "Math17kAlpacaStyleInstructionHandler"


def test_math_17k_handler_names_the_row_and_column_of_a_wrong_shape(tmp_path):
    rows = _math17k_rows()
    rows[3]["reward_model"] = "9"  # a bare string where the handler wants {"ground_truth": ...}
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = dict(_recipe("math_17k"), input=str(tmp_path / "m.jsonl"), tokenizer_name_or_path=TOKENIZER,
                  output_prefix=str(tmp_path / "data"))
    with pytest.raises(ValueError, match=r"row 3, column 'reward_model'.*Math17kAlpacaStyleInstructionHandler"):
        preprocess(recipe)


def test_other_handlers_and_tokenizer_types_are_clear_errors(tmp_path):
    done = _cli("orca_rlhf")
    assert done.returncode == 1 and "AlpacaStylePairwiseHandler" in done.stderr and "DPO" in done.stderr
    (tmp_path / "d.jsonl").write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n")
    with pytest.raises(ValueError, match="tokenizer_type 'Llama2Tokenizer'"):
        preprocess(dict(_recipe("deepscaler"), input=str(tmp_path / "d.jsonl"), tokenizer_name_or_path=TOKENIZER,
                        output_prefix=str(tmp_path / "o"), tokenizer_type="Llama2Tokenizer"))
