"""Benchmarks exit 1 when a target they print as FAIL fails, --quick included."""
import importlib.util
import os
import sys

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
