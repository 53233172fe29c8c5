"""The committed series are what patches/build_series.py makes of our package.

No upstream checkout needed: upstream originals come from the committed
whole-file hunks.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[1]
REPO = PATCHES.parent
BUILD = PATCHES / "build_series.py"
sys.path.insert(0, str(PATCHES))
import build_series  # noqa: E402
import series_spec  # noqa: E402

PACKAGE_FILES = [(commit, step, pkg) for commit, steps in series_spec.SERIES.items()
                 for step in steps for pkg in step.package]


def run_build(*args):
    return subprocess.run([sys.executable, str(BUILD), *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def post_image(section: str) -> str:
    """The file a whole-file (or new-file) diff leaves behind."""
    lines = section.split("\n")
    start = next(k for k, line in enumerate(lines) if line.startswith("@@"))
    assert sum(line.startswith("@@") for line in lines) == 1, "more than one hunk"
    text = ""
    for k in range(start + 1, len(lines)):
        if lines[k].startswith("+"):
            text += lines[k][1:] + "\n"
        elif lines[k] == build_series.NO_EOL and lines[k - 1].startswith("+"):
            text = text[:-1]
    return text


def test_check_passes_on_committed_tree():
    res = run_build("--check")
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("commit,step,pkg", PACKAGE_FILES,
                         ids=[f"{c}/{p.path.rsplit('/', 1)[1]}" for c, _, p in PACKAGE_FILES])
def test_package_file_is_post_image(commit, step, pkg):
    patch = PATCHES / "mindspeed-rl" / commit / f"{step.name}.patch"
    section = build_series.split_sections(patch.read_text(encoding="utf-8"))[pkg.target]
    old = build_series.old_from_section(section, pkg.target)
    assert (old is not None) == pkg.upstream_has
    if old is not None:
        assert "\n@@ -1," in section, "not one whole-file hunk"
    want = build_series.adapt((REPO / pkg.path).read_text(encoding="utf-8"), pkg, commit, old)
    assert post_image(section) == want, f"{commit}: {pkg.path} drifted from the package"
    if not pkg.adaptations:
        assert want == (REPO / pkg.path).read_text(encoding="utf-8")


def copy_package(tmp_path):
    shutil.copytree(REPO / "mindspeed_rl", tmp_path / "mindspeed_rl",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_check_fails_on_package_drift(tmp_path):
    pkg = copy_package(tmp_path)
    target = pkg / "mindspeed_rl" / "balance" / "partition_exact.py"
    lines = target.read_text(encoding="utf-8").split("\n")
    k = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith(("#", '"""')))
    lines[k] += "  # drift"
    target.write_text("\n".join(lines), encoding="utf-8")
    res = run_build("--check", "--package", pkg)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "mindspeed_rl/utils/partition_exact.py" in res.stderr  # the patched file, at its upstream path
    for commit in series_spec.SERIES:
        assert f"{commit}/0001" in res.stderr, f"series {commit} not reported"


def test_adaptation_that_no_longer_matches_fails(tmp_path):
    pkg = copy_package(tmp_path)
    target = pkg / "mindspeed_rl" / "balance" / "seqlen_balancing.py"
    text = target.read_text(encoding="utf-8")
    old = "def rearrange_micro_batches(seqlen_list, max_token_len: int,\n"
    assert text.count(old) == 1
    target.write_text(text.replace(old, "def rearrange_micro_batches(seqlen_list, max_token_len,\n"),
                      encoding="utf-8")
    res = run_build("--check", "--package", pkg)
    assert res.returncode == 1
    assert "mindspeed_rl/balance/seqlen_balancing.py: adaptation" in res.stderr
    assert "found 0 times" in res.stderr


def test_adaptations_declared_once_each():
    for commit, step, pkg in PACKAGE_FILES:
        for a in pkg.adaptations:
            assert a.why.strip(), f"{commit}: {pkg.path}: adaptation without a reason"
    assert {pkg.path for _, _, pkg in PACKAGE_FILES} == {
        "mindspeed_rl/balance/seqlen_balancing.py", "mindspeed_rl/balance/partition_refine.py",
        "mindspeed_rl/balance/partition_exact.py", "mindspeed_rl/balance/workload.py",
        "mindspeed_rl/utils/dist_sync.py", "mindspeed_rl/balance/balance_plan.py"}
    # the balancer lands at upstream's utils paths
    assert {pkg.target for _, _, pkg in PACKAGE_FILES if pkg.path.startswith("mindspeed_rl/balance/")} == {
        "mindspeed_rl/utils/seqlen_balancing.py", "mindspeed_rl/utils/partition_refine.py",
        "mindspeed_rl/utils/partition_exact.py", "mindspeed_rl/utils/workload.py",
        "mindspeed_rl/trainer/utils/balance_plan.py"}
    # the plan lands at upstream's path of the dock's helpers
    assert {pkg.target for _, _, pkg in PACKAGE_FILES if pkg.path.endswith("balance_plan.py")} == {
        "mindspeed_rl/trainer/utils/balance_plan.py"}
