"""Tests of the DP balance report tool (mindspeed_rl.reports.balance_report)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from mindspeed_rl.reports import balance_report as br
from mindspeed_rl.balance.workload import WorkloadModel

# long-tail lengths: 16 GRPO groups of 4 samples, a few very long responses
LONG_TAIL_RESPONSES = [
    [12, 15, 9, 14], [480, 22, 31, 18], [11, 13, 10, 16], [25, 20, 510, 470],
    [8, 9, 12, 10], [33, 29, 41, 38], [14, 11, 17, 13], [300, 12, 15, 19],
    [21, 18, 24, 20], [9, 10, 8, 11], [45, 50, 39, 42], [16, 14, 13, 15],
    [900, 35, 28, 30], [10, 12, 9, 14], [27, 23, 26, 22], [13, 12, 11, 10],
]
PROMPT_LENGTH = 20


def _rows(responses=LONG_TAIL_RESPONSES, with_ids=False):
    rows = []
    for g, group in enumerate(responses):
        for r in group:
            row = {"prompt_length": PROMPT_LENGTH, "response_length": r}
            if with_ids:
                row["prompt_id"] = f"p{g}"
            rows.append(row)
    return rows


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _write_csv(path, rows, columns=("prompt_length", "response_length")):
    lines = [",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _run(argv, capsys):
    code = br.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _json_plans(path):
    return json.loads(open(path, encoding="utf-8").read())["plans"]


def _bad(argv, capsys, *needles):
    """The call fails with exit code 2 and one stderr line naming each needle."""
    code, out, err = _run(argv, capsys)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("balance_report: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


# ---------------------------------------------------------------- lengths input


def test_jsonl_long_tail_numbers_consistent(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "lengths.jsonl", _rows())
    out_json = tmp_path / "report.json"
    code, out, err = _run(["--lengths", src, "--dp-size", 4, "--n-samples", 4, "--json", out_json], capsys)
    assert code == 0, err
    for word in ("rank 0", "rank 3", "before (random)", "after (balanced)", "max", "min", "mean",
                 "imbalance", "step-time gain"):
        assert word in out
    (plan,) = _json_plans(out_json)
    total = sum(PROMPT_LENGTH * 4 + sum(g) for g in LONG_TAIL_RESPONSES)
    assert sum(plan["before"]) == pytest.approx(total)
    assert sum(plan["after"]) == pytest.approx(total)
    assert plan["sizes"] == [4, 4, 4, 4] and plan["unit"] == "groups"
    s = plan["summary"]
    assert s["after"]["max"] <= s["before"]["max"]
    assert s["after"]["max"] == pytest.approx(max(plan["after"]))
    assert s["before"]["imbalance"] == pytest.approx(max(plan["before"]) / (total / 4) - 1)
    assert s["gain"] == pytest.approx(s["before"]["max"] / s["after"]["max"])
    assert s["after"]["max"] >= s["lower_bound"] - 1e-9
    assert f"{s['gain']:.3f}x" in out


def test_csv_matches_jsonl(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    src_jsonl = _write_jsonl(tmp_path / "lengths.jsonl", _rows())
    src_csv = _write_csv(tmp_path / "lengths.csv", _rows())
    assert _run(["--lengths", src_jsonl, "--dp-size", 4, "--n-samples", 4, "--json", a], capsys)[0] == 0
    assert _run(["--lengths", src_csv, "--dp-size", 4, "--n-samples", 4, "--json", b], capsys)[0] == 0
    pa, pb = _json_plans(a)[0], _json_plans(b)[0]
    assert pa["before"] == pb["before"] and pa["after"] == pb["after"]


def test_csv_with_prompt_id_column_and_extra_columns(tmp_path, capsys):
    rows = _rows(with_ids=True)
    for r in rows:
        r["note"] = "x"
    src = _write_csv(tmp_path / "lengths.csv", rows, columns=("note", "prompt_id", "response_length",
                                                               "prompt_length"))
    out_json = tmp_path / "r.json"
    assert _run(["--lengths", src, "--dp-size", 4, "--json", out_json], capsys)[0] == 0
    assert _json_plans(out_json)[0]["sizes"] == [4, 4, 4, 4]


def test_prompt_id_groups_stay_on_one_rank(tmp_path, capsys):
    # four groups with totals 1000, 100, 10, 1 tokens, rows interleaved
    rows = [{"prompt_id": "big", "prompt_length": 0, "response_length": 500},
            {"prompt_id": "mid", "prompt_length": 0, "response_length": 100},
            {"prompt_id": "big", "prompt_length": 0, "response_length": 500},
            {"prompt_id": "small", "prompt_length": 4, "response_length": 6},
            {"prompt_id": "tiny", "prompt_length": 1, "response_length": 0}]
    src = _write_jsonl(tmp_path / "ids.jsonl", rows)
    grouped, rowwise = tmp_path / "g.json", tmp_path / "r.json"
    assert _run(["--lengths", src, "--dp-size", 2, "--n-samples", 3, "--json", grouped], capsys)[0] == 0
    plan = _json_plans(grouped)[0]
    # the 'big' group (1000 tokens) is never split; two groups a rank: 1000 + 1 vs 100 + 10
    assert sorted(plan["after"]) == [110, 1001] and sorted(plan["sizes"]) == [2, 2]
    assert plan["unit"] == "groups"
    # --no-group balances single rows: 500 + 10 + 1 vs 500 + 100
    assert _run(["--lengths", src, "--dp-size", 2, "--no-group", "--json", rowwise], capsys)[0] == 0
    plan = _json_plans(rowwise)[0]
    assert sorted(plan["after"]) == [511, 600] and sorted(plan["sizes"]) == [2, 3]
    assert plan["unit"] == "rows"


def test_consecutive_rows_form_groups(tmp_path, capsys):
    # two groups of 2: (100, 100) and (1, 1); with grouping the split is 200 vs 2
    rows = [{"prompt_length": 0, "response_length": r} for r in (100, 100, 1, 1)]
    src = _write_jsonl(tmp_path / "l.jsonl", rows)
    out_json = tmp_path / "r.json"
    assert _run(["--lengths", src, "--dp-size", 2, "--n-samples", 2, "--json", out_json], capsys)[0] == 0
    assert sorted(_json_plans(out_json)[0]["after"]) == [2, 200]
    assert _run(["--lengths", src, "--dp-size", 2, "--n-samples", 2, "--no-group", "--json", out_json],
                capsys)[0] == 0
    assert _json_plans(out_json)[0]["after"] == [101, 101]


def test_non_divisible_group_count(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows(LONG_TAIL_RESPONSES[:7]))
    out_json = tmp_path / "r.json"
    code, out, err = _run(["--lengths", src, "--dp-size", 3, "--n-samples", 4, "--json", out_json], capsys)
    assert code == 0, err
    plan = _json_plans(out_json)[0]
    assert sorted(plan["sizes"]) == [2, 2, 3]
    assert sum(plan["before"]) == pytest.approx(sum(plan["after"]))
    assert max(plan["after"]) <= max(plan["before"])


@pytest.mark.parametrize("method", ["auto", "heapq", "karmarkar_karp"])
def test_methods(tmp_path, capsys, method):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows())
    out_json = tmp_path / "r.json"
    code, _, err = _run(["--lengths", src, "--dp-size", 4, "--n-samples", 4, "--method", method,
                         "--json", out_json], capsys)
    assert code == 0, err
    plan = _json_plans(out_json)[0]
    assert plan["method"] == method and sum(plan["sizes"]) == 16


def test_seed_fixes_the_random_split(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows())
    befores = []
    for seed in (7, 7, 8):
        out_json = tmp_path / f"r{len(befores)}.json"
        assert _run(["--lengths", src, "--dp-size", 4, "--n-samples", 4, "--seed", seed, "--json", out_json],
                    capsys)[0] == 0
        befores.append(_json_plans(out_json)[0]["before"])
    assert befores[0] == befores[1] and befores[0] != befores[2]


def test_flops_objective(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows())
    out_json = tmp_path / "r.json"
    dims = ["--hidden-size", 64, "--num-layers", 2, "--num-heads", 4, "--ffn-size", 128,
            "--num-kv-heads", 2, "--vocab-size", 100]
    code, out, err = _run(["--lengths", src, "--dp-size", 4, "--n-samples", 4, "--objective", "flops",
                           *dims, "--json", out_json], capsys)
    assert code == 0, err
    assert "(flops)" in out
    plan = _json_plans(out_json)[0]
    model = WorkloadModel.from_dims(64, 2, 4, 128, num_kv_heads=2, vocab_size=100)
    lengths = np.array([PROMPT_LENGTH + r for g in LONG_TAIL_RESPONSES for r in g], dtype=float)
    assert model.quadratic > 0
    assert sum(plan["after"]) == pytest.approx(model.cost(lengths).sum())
    assert sum(plan["before"]) == pytest.approx(model.cost(lengths).sum())
    assert plan["objective"] == "flops"
    assert max(plan["after"]) <= max(plan["before"])


def test_png_written(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows())
    png = tmp_path / "sub" / "chart.png"
    code, out, err = _run(["--lengths", src, "--dp-size", 4, "--n-samples", 4, "--png", png], capsys)
    assert code == 0, err
    data = png.read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in out


# ---------------------------------------------------------------- run input


BALANCE_LINES = [
    {"iteration": 1, "consumer": "ref_log_prob", "objective": "tokens", "loads": [173.0, 174.0],
     "random_loads": [166.0, 181.0], "sizes": [4, 4]},
    {"iteration": 1, "consumer": "actor_train", "objective": "tokens", "loads": [89.0, 89.0, 86.0, 83.0],
     "random_loads": [87.0, 83.0, 85.0, 92.0], "sizes": [2, 2, 2, 2]},
    {"iteration": 2, "consumer": "ref_log_prob", "objective": "tokens", "loads": [176.0, 174.0],
     "random_loads": [160.0, 190.0], "sizes": [4, 4]},
    {"iteration": 2, "consumer": "actor_train", "objective": "tokens", "loads": [88.0, 88.0, 88.0, 86.0],
     "random_loads": [88.0, 72.0, 96.0, 94.0], "sizes": [2, 2, 2, 2]},
]


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    _write_jsonl(folder / "balance.jsonl", BALANCE_LINES)
    (folder / "metrics.jsonl").write_text('{"iteration": 1}\n', encoding="utf-8")
    return folder


def test_run_folder_last_iteration_all_consumers(run_dir, tmp_path, capsys):
    out_json = tmp_path / "r.json"
    code, out, err = _run(["--run", run_dir, "--json", out_json], capsys)
    assert code == 0, err
    assert "iteration 2, ref_log_prob" in out and "iteration 2, actor_train" in out
    assert "iteration 1" not in out
    plans = _json_plans(out_json)
    assert [(p["iteration"], p["consumer"]) for p in plans] == [(2, "ref_log_prob"), (2, "actor_train")]
    train = plans[1]
    assert train["before"] == BALANCE_LINES[3]["random_loads"] and train["after"] == BALANCE_LINES[3]["loads"]
    s = train["summary"]
    assert s["before"]["max"] == 96 and s["after"]["max"] == 88
    assert s["gain"] == pytest.approx(96 / 88)
    assert s["before"]["imbalance"] == pytest.approx(96 / 87.5 - 1)
    assert s["after"]["imbalance"] == pytest.approx(88 / 87.5 - 1)
    assert "9.71%" in out and "0.57%" in out and "1.091x" in out


def test_run_file_pick_consumer_and_iteration(run_dir, tmp_path, capsys):
    out_json = tmp_path / "r.json"
    png = tmp_path / "run.png"
    code, out, err = _run(["--run", run_dir / "balance.jsonl", "--consumer", "actor_train", "--iteration", 1,
                           "--json", out_json, "--png", png], capsys)
    assert code == 0, err
    (plan,) = _json_plans(out_json)
    assert plan["iteration"] == 1 and plan["consumer"] == "actor_train"
    assert plan["sizes"] == [2, 2, 2, 2] and "share 3" in out
    assert png.stat().st_size > 1000


def test_run_repeated_plans_are_numbered(tmp_path, capsys):
    lines = BALANCE_LINES[3:] * 2
    src = _write_jsonl(tmp_path / "balance.jsonl", lines)
    png = tmp_path / "two.png"
    code, out, err = _run(["--run", src, "--png", png], capsys)
    assert code == 0, err
    assert "actor_train #1" in out and "actor_train #2" in out
    assert png.stat().st_size > 1000


def test_the_rollout_queues_plan_reads_as_engines_busy_seconds(tmp_path, capsys):
    queue = {"iteration": 3, "consumer": "actor_rollout", "objective": "seconds", "balanced": True,
             "served": "queue", "loads": [2.5, 2.45], "random_loads": [3.125, 2.0], "sizes": [61, 67]}
    src = _write_jsonl(tmp_path / "balance.jsonl", [queue])
    out_json, png = tmp_path / "q.json", tmp_path / "q.png"
    code, out, err = _run(["--run", src, "--json", out_json, "--png", png], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split() == ["rows", "static", "split", "(replayed)", "queue", "(measured)"]
    assert lines[3].split() == ["engine", "0", "61", "3.125", "2.500"]
    assert next(line for line in lines if line.startswith("imbalance")).split() == ["imbalance", "21.95%", "1.01%"]
    (plan,) = _json_plans(out_json)
    assert plan["served"] == "queue" and plan["share"] == "engine" and plan["unit"] == "rows"
    assert plan["summary"]["gain"] == pytest.approx(3.125 / 2.5)
    assert png.stat().st_size > 1000


# ---------------------------------------------------------------- bad input


def test_missing_lengths_file(tmp_path, capsys):
    _bad(["--lengths", tmp_path / "nope.jsonl", "--dp-size", 2], capsys, "no such file", "nope.jsonl")


def test_bad_json_line(tmp_path, capsys):
    path = tmp_path / "l.jsonl"
    path.write_text('{"prompt_length": 1, "response_length": 2}\n{"prompt_length": 1,\n', encoding="utf-8")
    _bad(["--lengths", path, "--dp-size", 1], capsys, "l.jsonl", "line 2", "not valid JSON")


def test_jsonl_missing_field(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", [{"prompt_length": 1, "response_length": 2}, {"prompt_length": 3}])
    _bad(["--lengths", src, "--dp-size", 1], capsys, "l.jsonl", "line 2", "response_length")


def test_csv_header_missing_column(tmp_path, capsys):
    path = tmp_path / "l.csv"
    path.write_text("prompt_length,resp\n1,2\n", encoding="utf-8")
    _bad(["--lengths", path, "--dp-size", 1], capsys, "l.csv", "line 1", "response_length",
         "found: prompt_length, resp")


def test_non_numeric_length(tmp_path, capsys):
    path = tmp_path / "l.csv"
    path.write_text("prompt_length,response_length\n1,2\n3,abc\n", encoding="utf-8")
    _bad(["--lengths", path, "--dp-size", 1], capsys, "row 2", "line 3", "response_length", "abc")


def test_negative_length(tmp_path, capsys):
    rows = _rows(LONG_TAIL_RESPONSES[:2])
    rows[2]["response_length"] = -5
    src = _write_jsonl(tmp_path / "l.jsonl", rows)
    _bad(["--lengths", src, "--dp-size", 2, "--n-samples", 4], capsys, "row 3", "negative response_length -5")


def test_empty_lengths_file(tmp_path, capsys):
    path = tmp_path / "l.jsonl"
    path.write_text("\n", encoding="utf-8")
    _bad(["--lengths", path, "--dp-size", 1], capsys, "no rows")


def test_mixed_prompt_ids(tmp_path, capsys):
    rows = _rows(LONG_TAIL_RESPONSES[:1], with_ids=True)
    del rows[2]["prompt_id"]
    src = _write_jsonl(tmp_path / "l.jsonl", rows)
    _bad(["--lengths", src, "--dp-size", 1], capsys, "row 3", "prompt_id")


@pytest.mark.parametrize("dp, needle", [(0, "--dp-size must be >= 1, got 0"),
                                        (-2, "--dp-size must be >= 1, got -2"),
                                        (17, "--dp-size 17 is larger than the number of groups (16)")])
def test_bad_dp_size(tmp_path, capsys, dp, needle):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows())
    _bad(["--lengths", src, "--dp-size", dp, "--n-samples", 4], capsys, needle)


def test_dp_size_required(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows())
    _bad(["--lengths", src], capsys, "--dp-size")


def test_rows_not_whole_groups(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows()[:-1])
    _bad(["--lengths", src, "--dp-size", 2, "--n-samples", 4], capsys, "63 rows", "--n-samples 4")


def test_flops_needs_dimensions(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows())
    _bad(["--lengths", src, "--dp-size", 2, "--objective", "flops", "--hidden-size", 64], capsys,
         "--num-layers", "--num-heads", "--ffn-size")


def test_heapq_needs_divisible_count(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows(LONG_TAIL_RESPONSES[:7]))
    _bad(["--lengths", src, "--dp-size", 2, "--n-samples", 4, "--method", "heapq"], capsys,
         "heapq", "divisible")


def test_no_input_given(capsys):
    _bad([], capsys, "--lengths", "--run")


def test_run_options_rejected_with_lengths(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "l.jsonl", _rows())
    _bad(["--lengths", src, "--dp-size", 2, "--consumer", "actor_train"], capsys, "--consumer")


def test_unknown_consumer_lists_consumers(run_dir, capsys):
    _bad(["--run", run_dir, "--consumer", "critic"], capsys, "'critic'", "ref_log_prob, actor_train")


def test_unknown_iteration_lists_iterations(run_dir, capsys):
    _bad(["--run", run_dir, "--iteration", 9], capsys, "iteration 9", "iterations: 1-2")


def test_run_folder_without_balance_file(tmp_path, capsys):
    _bad(["--run", tmp_path], capsys, "no balance.jsonl", str(tmp_path))


def test_run_missing_path(tmp_path, capsys):
    _bad(["--run", tmp_path / "gone"], capsys, "no such file or folder", "gone")


def test_run_bad_lines(tmp_path, capsys):
    path = tmp_path / "balance.jsonl"
    path.write_text(json.dumps(BALANCE_LINES[0]) + "\nnot json\n", encoding="utf-8")
    _bad(["--run", path], capsys, "balance.jsonl line 2", "not valid JSON")
    path.write_text(json.dumps({"iteration": 1, "consumer": "a", "loads": [1.0]}) + "\n", encoding="utf-8")
    _bad(["--run", path], capsys, "line 1", "random_loads")
    path.write_text(json.dumps({"iteration": 1, "consumer": "a", "loads": [1.0], "random_loads": [1, 2]}) + "\n",
                    encoding="utf-8")
    _bad(["--run", path], capsys, "line 1", "random_loads has 2 entries")


def test_module_entry_point_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mindspeed_rl.tools.balance_report", "--lengths",
                           str(tmp_path / "missing.csv"), "--dp-size", "2"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "missing.csv" in proc.stderr and "Traceback" not in proc.stderr


def test_rank_bound_plans_report_one_bar_per_rank(tmp_path):
    plan = {"iteration": 1, "consumer": "actor_train", "objective": "tokens", "loads": [10, 20, 30, 40],
            "random_loads": [5, 15, 35, 45], "sizes": [2, 2, 2, 2], "ranks": [0, 1, 0, 1]}
    (tmp_path / "balance.jsonl").write_text(json.dumps(plan) + "\n")
    (report,) = br.report_from_run(str(tmp_path))
    assert report.share == "rank"
    assert list(report.after) == [40, 60] and list(report.before) == [40, 60] and list(report.sizes) == [4, 4]
    bad = dict(plan, ranks=[0, 1])
    (tmp_path / "balance.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(br.ReportError, match="ranks must be a list of 4"):
        br.report_from_run(str(tmp_path))


# ---------------------------------------------------------------- report and console agree

# one round of the tiny run: rollout not balanced; actor_train with 2 shares per rank (share s -> rank s % 2),
# where per-share and per-rank imbalance differ
ROUND = [
    {"iteration": 4, "consumer": "actor_rollout", "objective": "tokens", "balanced": False,
     "loads": [48.0, 48.0], "random_loads": [48.0, 48.0], "sizes": [16, 16], "ranks": [0, 1]},
    {"iteration": 4, "consumer": "actor_train", "objective": "tokens", "balanced": True,
     "loads": [88.0, 88.0, 88.0, 87.0], "random_loads": [100.0, 70.0, 89.0, 92.0], "sizes": [8, 8, 8, 8],
     "ranks": [0, 1, 0, 1]},
]


def test_console_random_and_report_before_are_one_number(tmp_path, capsys):
    from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
    from mindspeed_rl.utils.metrics import imbalance, plan_balance_metrics

    _write_jsonl(tmp_path / "balance.jsonl", [{"event": "resume", "from_iteration": 3}] + ROUND)
    out_json = tmp_path / "r.json"
    code, out, err = _run(["--run", tmp_path, "--consumer", "actor_train", "--json", out_json], capsys)
    assert code == 0, err
    before = _json_plans(out_json)[0]["summary"]["before"]["imbalance"]
    assert before == pytest.approx(189 / 175.5 - 1)  # rank 0: 100 + 89, rank 1: 70 + 92
    assert before != pytest.approx(imbalance(ROUND[1]["random_loads"]))  # per share would be another number
    metrics = plan_balance_metrics(ROUND)
    assert metrics["dp_balance/actor_train/rank_imbalance_random"] == pytest.approx(before)
    metrics.update({"dp_balance/actor_train/rank_imbalance": 0.0029,
                    "dp_balance/actor_train/imbalance_random": imbalance(ROUND[1]["random_loads"])})
    line = RayGRPOTrainer._summary(4, metrics)
    assert f"actor_train:imb=0.29%(random {before:.2%})" in line
    assert f"{before:.2%}" in out


def test_unbalanced_stage_is_not_listed_as_balanced(tmp_path, capsys):
    _write_jsonl(tmp_path / "balance.jsonl", ROUND)
    code, out, err = _run(["--run", tmp_path], capsys)
    assert code == 0, err
    assert "actor_rollout" not in out.split("not balanced, left out")[0]
    assert "iteration 4, actor_train" in out and "after (balanced)" in out
    assert "not balanced, left out: actor_rollout" in out
    code, out, err = _run(["--run", tmp_path, "--consumer", "actor_rollout"], capsys)
    assert code == 0, err
    assert "iteration 4, actor_rollout" in out and "served (not balanced)" in out and "after (balanced)" not in out
    code, out, err = _run(["--run", tmp_path, "--consumer", "actor_train"], capsys)
    assert code == 0 and "left out" not in out  # the user picked the stage: no note
    # a run with balance off: every stage is shown, none as balanced
    off = [dict(p, balanced=False) for p in ROUND]
    _write_jsonl(tmp_path / "balance.jsonl", off)
    code, out, err = _run(["--run", tmp_path], capsys)
    assert code == 0 and out.count("served (not balanced)") == 2 and "after (balanced)" not in out


def test_shipped_lengths_example_runs_as_the_readme_says(capsys):
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    readme = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    command = "balance_report --lengths benchmarks/lengths_example.jsonl --dp-size 8 --n-samples 8"
    assert command in readme
    code, out, err = _run(["--lengths", os.path.join(root, "benchmarks", "lengths_example.jsonl"),
                           "--dp-size", 8, "--n-samples", 8], capsys)
    assert code == 0, err
    assert "16 groups on 8 ranks" in out and "after (balanced)" in out


def test_a_multi_turn_rounds_plan_says_its_bound_and_the_engines_while_tools_ran(tmp_path, capsys):
    queue = {"iteration": 2, "consumer": "actor_rollout", "objective": "seconds", "balanced": True,
             "served": "queue", "loads": [4.0, 3.0], "random_loads": [4.0, 3.0], "sizes": [5, 3],
             "lower_bound": 3.5, "tools": {"running": [2.0, 1.0], "busy": [1.5, 0.0]}}
    src = _write_jsonl(tmp_path / "balance.jsonl", [queue])
    out_json = tmp_path / "q.json"
    code, out, err = _run(["--run", src, "--json", out_json], capsys)
    assert code == 0, err
    assert "lower bound on the max load: 3.5 (after is 14.29% above it)" in out
    assert ("while tools ran: engines busy 50.0% (75% / 0% per engine); tool time 42.9% of the engines' serve "
            "seconds (not replayed: the step cost knows no tool time)") in out
    (plan,) = _json_plans(out_json)
    assert plan["tools"] == {"running": [2.0, 1.0], "busy": [1.5, 0.0]} and plan["summary"]["lower_bound"] == 3.5


@pytest.mark.parametrize("field,value,needle", [
    ("tools", [1.0], "tools must be an object with 'running' and 'busy'"),
    ("tools", {"running": [1.0, 1.0]}, "tools must be an object with 'running' and 'busy'"),
    ("tools", {"running": [1.0], "busy": [0.5]}, "tools.running and tools.busy must have 2 entries, as loads"),
    ("tools", {"running": [1.0, -1.0], "busy": [0.5, 0.0]}, "tools.running"),
    ("lower_bound", "far", "lower_bound must be a number"),
])
def test_a_bad_multi_turn_figure_is_one_line(tmp_path, capsys, field, value, needle):
    queue = {"iteration": 2, "consumer": "actor_rollout", "objective": "seconds", "served": "queue",
             "loads": [4.0, 3.0], "random_loads": [4.0, 3.0], field: value}
    src = _write_jsonl(tmp_path / "balance.jsonl", [queue])
    _bad(["--run", src], capsys, "balance.jsonl line 1", needle)
