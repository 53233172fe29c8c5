"""Benchmarks exit 1 when a target they print as FAIL fails, --quick included."""
import importlib.util
import os
import sys

import pytest

from vllm_need import need_vllm

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
    from mindspeed_rl.config_cls.stages import STAGES
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


@pytest.fixture(scope="module")
def rollout_quick(tmp_path_factory):
    """One real `bench_rollout.py --quick` (tiny and 14M models, both backends; ~2 min on 2 cores)."""
    need_vllm()
    import json
    bench = _load("bench_rollout")
    out = tmp_path_factory.mktemp("rollout_quick")
    code = bench.main(["--quick", "--out-dir", str(out)])
    return bench, code, json.loads((out / "bench_rollout.json").read_text())


@pytest.mark.parametrize("break_target", [False, True])
def test_rollout_quick_exit_code_follows_the_fail_lines(rollout_quick, monkeypatch, capsys, tmp_path, break_target):
    bench, code, res = rollout_quick
    status = {t["name"]: t["status"] for t in res["targets"]}
    assert status["150M GRPO iteration"] == "INFO" and status["150M rollout float32"] == "INFO"
    assert status["14M rollout"] in ("PASS", "FAIL") and status["full length"] in ("PASS", "FAIL")
    if not break_target:
        assert code == (1 if "FAIL" in status.values() else 0)
        return
    # the same measurements judged against a 1000x target: the 14M rollout must FAIL, exit 1
    monkeypatch.setattr(bench, "measure", lambda args, tmp: dict(res))
    code = bench.main(["--quick", "--out-dir", str(tmp_path), "--target-scale", "1000"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "| 14M rollout | FAIL |" in out and "targets FAILED: " in err and "14M rollout" in err
