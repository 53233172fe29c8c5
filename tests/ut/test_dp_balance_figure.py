"""sources/images/remove_padding/dp_balance.png, its data (dp_balance.json) and the numbers the docs quote come
from one run of docs/scripts/draw_dp_balance.py: the script's own computation, rerun here on the plan it saved
(no training run), gives the saved numbers; the PNG is the one the script wrote with them; the doc paragraph
that shows the picture quotes exactly those numbers; the saved plan has the shape of the script's run."""
import hashlib
import importlib.util
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGES = os.path.join(ROOT, "sources", "images", "remove_padding")
PNG = os.path.join(IMAGES, "dp_balance.png")
DATA = os.path.join(IMAGES, "dp_balance.json")
# docs that show the picture: (file, a phrase of the paragraph that quotes its numbers)
DOCS = [(os.path.join(ROOT, "docs", "features", "dp_batch_balance.md"), "draw_dp_balance.py")]


def _script():
    spec = importlib.util.spec_from_file_location(
        "draw_dp_balance", os.path.join(ROOT, "docs", "scripts", "draw_dp_balance.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def script():
    return _script()


@pytest.fixture(scope="module")
def data():
    with open(DATA, encoding="utf-8") as f:
        return json.load(f)


def test_the_saved_numbers_are_the_scripts_computation_on_the_saved_plan(script, data):
    report = script.report_from_data(data)
    assert script.figure_numbers(report) == data["numbers"]
    assert report.label == data["label"]


def test_the_png_is_the_one_drawn_with_those_numbers(data):
    with open(PNG, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == data["png_sha256"], \
            "dp_balance.png changed without dp_balance.json: regenerate both with docs/scripts/draw_dp_balance.py"


def test_the_plan_has_the_shape_of_the_scripts_run(script, data):
    plan = data["plan"]
    prompts = int(next(o for o in script.RUN_OVERRIDES if o.startswith("megatron_training.global_batch_size="))
                  .split("=")[1])
    assert data["consumer"] == plan["consumer"] == "actor_train"
    assert data["n_samples_per_prompt"] == script.n_samples_of(script.RUN_OVERRIDES)
    assert sum(plan["sizes"]) == prompts * data["n_samples_per_prompt"]
    assert sorted(set(plan["ranks"])) == list(range(script.DP_RANKS))


def test_the_label_counts_rows_and_groups(script, data):
    report = script.report_from_data(data)
    rows = sum(report.sizes)
    assert report.unit == "rows"
    assert f"{rows} rows = {rows // 4} GRPO groups x 4 samples" in report.label


def _paragraph(path, phrase):
    with open(path, encoding="utf-8") as f:
        (para,) = [p for p in f.read().split("\n\n") if phrase in p]
    return para


@pytest.mark.parametrize("path,phrase", DOCS, ids=[os.path.relpath(p, ROOT) for p, _ in DOCS])
def test_docs_quote_the_figures_numbers(data, path, phrase):
    para = _paragraph(path, phrase)
    n = data["numbers"]
    assert re.findall(r"\d+(?:\.\d+)?%", para) == [n["imbalance_before"], n["imbalance_after"]]
    assert re.findall(r"\d+\.\d+x", para) == [n["step_time_gain"]]
