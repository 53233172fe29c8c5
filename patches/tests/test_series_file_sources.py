"""Where build_series reads upstream files: `git show` of a commit (text only; a binary or missing file
is None) and an unpacked source release whose version stamp must match."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PATCHES))
import build_series  # noqa: E402


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_upstream_file_from_a_commit(tmp_path):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True)

    git("init", "-q")
    git("config", "user.email", "t@example.invalid")
    git("config", "user.name", "t")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("print('é')\n", encoding="utf-8")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00\x81")
    git("add", "-A")
    git("commit", "-q", "-m", "c")
    commit = git("rev-parse", "HEAD").stdout.strip()
    git_dir = str(tmp_path / ".git")
    assert build_series.upstream_file(git_dir, commit, "pkg/a.py") == "print('é')\n"
    assert build_series.upstream_file(git_dir, commit, "pkg/missing.py") is None
    assert build_series.upstream_file(git_dir, commit, "blob.bin") is None  # not UTF-8: copied as stored
    assert build_series.upstream_file(None, commit, "pkg/a.py") is None


def test_source_tree_file_checks_the_version_stamp(tmp_path):
    (tmp_path / "verl" / "version").mkdir(parents=True)
    (tmp_path / "verl" / "version" / "version").write_text("0.9.1\n", encoding="utf-8")
    (tmp_path / "verl" / "x.py").write_text("x = 'é'\n", encoding="utf-8")
    assert build_series.source_tree_file(str(tmp_path), "verl/x.py", "0.9.1") == "x = 'é'\n"
    assert build_series.source_tree_file(str(tmp_path), "verl/missing.py", "0.9.1") is None
    assert build_series.source_tree_file(None, "verl/x.py", "0.9.1") is None
    with pytest.raises(build_series.BuildError, match=rf"^--verl-src {tmp_path}: verl version 0.9.1, the series needs 1.0$"):
        build_series.source_tree_file(str(tmp_path), "verl/x.py", "1.0")
    (tmp_path / "verl" / "version" / "version").unlink()
    with pytest.raises(build_series.BuildError, match=r"verl version None, the series needs 0.9.1$"):
        build_series.source_tree_file(str(tmp_path), "verl/x.py", "0.9.1")
