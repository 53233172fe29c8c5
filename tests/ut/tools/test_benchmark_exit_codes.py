"""Benchmarks exit 1 when a target they print as FAIL fails, --quick included."""
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("break_equal", [False, True])
def test_transfer_dock_quick_exit_code_follows_the_fail_lines(monkeypatch, capsys, break_equal):
    bench = _load("bench_transfer_dock")
    if break_equal:  # the offline reference disagrees with what the dock served: 'equal' must FAIL
        real = bench.run_offline

        def shifted(*args, **kwargs):
            out = real(*args, **kwargs)
            out["groups"] = out["groups"][1:] + out["groups"][:1]
            out["groups"][0] = list(out["groups"][0])[1:]
            return out
        monkeypatch.setattr(bench, "run_offline", shifted)
    monkeypatch.setattr(sys, "argv", ["bench_transfer_dock.py", "--quick", "--no-ray", "--repeats", "1"])
    code = bench.main()
    out, err = capsys.readouterr()
    targets = out[out.index("== TARGETS =="):]
    assert "speed      : INFO" in targets  # round-time targets are for the full size
    fails = [line for line in targets.splitlines() if ": FAIL" in line]
    assert code == (1 if fails else 0)
    assert bool(fails) == break_equal
    if break_equal:
        assert fails[0].startswith("equal") and "targets FAILED: equal" in err


def test_smoke_table_has_a_row_per_dp_stage_and_skips_resume_markers(tmp_path, capsys):
    import json
    from mindspeed_rl.plan.stages import STAGES
    table = _load("smoke_table")
    names = [s.name for s in STAGES if s.kind == "dp"]
    rows = []
    for it in (1, 2, 3):
        if it == 2:  # a run resumed after iteration 1
            rows.append({"event": "resume", "from_iteration": 1})
        row = {"iteration": it, "timing/iteration": 1.0, "reward/mean": 0.5}
        for name in names:
            row.update({f"timing/{name}/max": 0.5, f"tokens/{name}/rank0": 100.0, f"tokens/{name}/rank1": 100.0})
        rows.append(row)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert table.main(str(path)) == 0
    out = capsys.readouterr().out
    for name in names:
        assert any(line.split()[:2] == [name, "400.0"] for line in out.splitlines()), (name, out)


@pytest.fixture
def rollout_quick(monkeypatch, tmp_path):
    """`bench_rollout.py --quick` judged on the measurements of the committed full run, cut to what --quick
    measures (tiny and 14M float32, no 150M, no CLI runs): the targets and the exit code, not the machine."""
    import json
    bench = _load("bench_rollout")
    full = json.loads((Path(ROOT) / "benchmarks" / "results" / "bench_rollout.json").read_text())
    quick = dict(full, quick=True, cli={}, bf16_150m_skipped=None,
                 balance_cases={"tiny": full["balance_cases"]["tiny"]},
                 rollout=[r for r in full["rollout"] if r["model"] in ("tiny", "14M") and r["dtype"] == "float32"])
    for key in ("wall_s", "targets"):
        quick.pop(key, None)
    monkeypatch.setattr(bench, "measure", lambda args, tmp: json.loads(json.dumps(quick)))
    code = bench.main(["--quick", "--out-dir", str(tmp_path)])
    return bench, code, json.loads((tmp_path / "bench_rollout.json").read_text()), quick


@pytest.mark.parametrize("break_target", [False, True])
def test_rollout_quick_exit_code_follows_the_fail_lines(rollout_quick, monkeypatch, capsys, tmp_path, break_target):
    bench, code, res, quick = rollout_quick
    status = {t["name"]: t["status"] for t in res["targets"]}
    assert status["150M GRPO iteration"] == "INFO" and status["150M rollout float32"] == "INFO"
    assert status["14M rollout"] in ("PASS", "FAIL") and status["full length"] in ("PASS", "FAIL")
    if not break_target:
        assert code == (1 if "FAIL" in status.values() else 0)
        return
    # the same measurements judged against a 1000x target: the 14M rollout must FAIL, exit 1
    monkeypatch.setattr(bench, "measure", lambda args, tmp: dict(quick))
    code = bench.main(["--quick", "--out-dir", str(tmp_path), "--target-scale", "1000"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "| 14M rollout | FAIL |" in out and "targets FAILED: " in err and "14M rollout" in err


def _agent_engine(stage, busy, turns, tools, idle=0.0):
    """One engine's records as bench_agent_rollout's Engine.run returns them (one row per engine): busy spans,
    (row, turn, start, end) turn and tool spans."""
    rows = sorted({r for r, _, _, _ in turns})
    stats = [{"turns": 2, "tool_calls": 1, "tool_rounds": 1, "tool_errors": 0, "tool_timeouts": 0,
              "tool_seconds": 3.0, "stop": "answered"} for _ in rows]
    return {"stage": stage, "tool_wait": idle, "rows": rows, "responses": [[7, r] for r in rows], "stats": stats,
            "steps": 10, "live": 20, "busy_spans": busy, "turn_spans": turns, "tool_spans": tools}


def _agent_measured(case):
    """Two engines, one row each: the blocking loop idles while the row's tool runs (stage 8 s); the continuous
    path steps other rows meanwhile (stage 5 s), or idles for half of the tool ('idle'), or makes another
    response for row 0 ('other')."""
    ways = {"blocking": [_agent_engine(8.0, [(0, 3), (6, 8)], [(e, 0, 0, 3), (e, 1, 6, 8)], [(e, 0, 3, 6)], 3.0)
                         for e in range(2)]}
    busy = [(0, 3), (4, 5)] if case == "idle" else [(0, 5)]
    for way in ("continuous", "continuous_static"):
        ways[way] = [_agent_engine(5.0, busy, [(e, 0, 0, 2), (e, 1, 4, 5)], [(e, 0, 2, 4)]) for e in range(2)]
    # free routing: 5.2 s, within the slack of the sticky default; 4 s ('routing'): sticky is the slower one
    free = 4.0 if case == "routing" else 5.2
    ways["continuous_free"] = [_agent_engine(free, [(0, free)], [(e, 0, 0, 2), (e, 1, free - 1, free)],
                                             [(e, 0, 2, free - 1)]) for e in range(2)]
    if case == "other":
        ways["continuous"][0]["responses"] = [[8, 0]]
    return {"quick": True, "cpus": 2, "load_before": (1.0, 1.0, 1.0), "load_after": (1.0, 1.0, 1.0), "prompts": 1,
            "samples": 2, "max_num_seqs": 4, "params": 1e6, "startup_s": 1.0,
            "engines": [{"core": c, "affinity": [c], "omp_bind": str(c)} for c in range(2)],
            "repeats": [{"round": {"lengths": [[3, 2]] * 2, "tools": [[3.0]] * 2}, "ways": ways}] * 3}


@pytest.mark.parametrize("case", ["met", "idle", "scaled", "other", "routing"])
def test_agent_rollout_exit_code_follows_the_fail_lines(monkeypatch, capsys, tmp_path, case):
    import json
    bench = _load("bench_agent_rollout")
    monkeypatch.setattr("mindspeed_rl.plan.multi_turn.DEFAULT_ROUTING", "sticky")
    monkeypatch.setattr(bench, "measure", lambda args: _agent_measured(case))
    argv = ["--quick", "--out-dir", str(tmp_path)] + (["--target-scale", "2"] if case == "scaled" else [])
    code = bench.main(argv)
    out, err = capsys.readouterr()
    targets = out[out.index("== TARGETS =="):]
    fails = [line.split(":")[0].strip() for line in targets.splitlines() if ": FAIL" in line]
    assert code == (1 if fails else 0)
    assert fails == {"met": [], "idle": ["busy while tools"], "scaled": ["speed"], "other": ["same work"],
                     "routing": ["routing"]}[case]
    fig = json.loads((tmp_path / "bench_agent_rollout.json").read_text())["figures"][0]
    # the blocking loop steps none of the time a tool runs; continuous all of it, or half when it idles 1 of 2 s
    assert fig["blocking"]["busy_while_tools"] == 0.0
    assert fig["continuous"]["busy_while_tools"] == (0.5 if case == "idle" else 1.0)
    assert fig["continuous"]["bound"] == 5.0 and fig["continuous"]["gap"] == 0.0  # path 2 + 2 + 1 s = busy 5 s
    assert fig["continuous"]["speedup"] == 8.0 / 5.0 and fig["blocking"]["idle_gain"] == 8.0 / 5.0
    assert fig["continuous"]["identical"] == (0.5 if case == "other" else 1.0)
    # 5 busy seconds (4 when it idles) over the row's 3 + 2 tokens
    assert fig["continuous"]["ms_per_token"] == [800.0 if case == "idle" else 1000.0] * 2
    ratio = 5.0 / (4.0 if case == "routing" else 5.2)
    assert f"default multi_turn_routing=sticky: its stage / free's = {ratio:.3f}" in out
    assert fig["continuous_free"]["speedup"] == 8.0 / (4.0 if case == "routing" else 5.2)
    if fails:
        assert f"targets FAILED: {', '.join(fails)}" in err


@pytest.mark.parametrize("flag, value", [("--repeats", "0"), ("--max-num-seqs", "0"), ("--target-scale", "0")])
def test_agent_rollout_refuses_bad_flags_before_it_measures(monkeypatch, capsys, flag, value):
    bench = _load("bench_agent_rollout")
    monkeypatch.setattr(bench, "measure", lambda args: pytest.fail("measured despite a bad flag"))
    with pytest.raises(SystemExit) as stop:
        bench.main(["--quick", flag, value])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"error: {flag} must be {'> 0' if flag == '--target-scale' else '>= 1'}, got {value}")
