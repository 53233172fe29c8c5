"""normalize_edit against git: a stored edit whose hunk headers and index line are wrong is recounted and
re-hashed to exactly what `git diff` writes (several hunks, added and removed lines, files with and without
a final newline, edits at either end)."""
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PATCHES))
import build_series  # noqa: E402


def _edit(rng, lines):
    out = list(lines)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out) + 1)
        op = rng.choice(("add", "del", "change"))
        if op == "add" or not out:
            out[at:at] = [f"new {rng.randrange(1000)}" for _ in range(rng.randint(1, 3))]
        elif op == "del":
            del out[min(at, len(out) - 1)]
        else:
            out[min(at, len(out) - 1)] = f"changed {rng.randrange(1000)}"
    return out


def _git_diff(tmp_path, pre, post):
    (tmp_path / "a").mkdir(exist_ok=True)
    (tmp_path / "b").mkdir(exist_ok=True)
    (tmp_path / "a" / "m.py").write_text(pre, encoding="utf-8")
    (tmp_path / "b" / "m.py").write_text(post, encoding="utf-8")
    res = subprocess.run(["git", "diff", "--no-index", "--no-color", "--no-prefix", "a/m.py", "b/m.py"],
                         cwd=tmp_path, capture_output=True, text=True)
    text = res.stdout
    # the series stores diffs as a/<path> b/<path> of the package path
    return (text.replace("diff --git a/m.py b/m.py", "diff --git a/pkg/m.py b/pkg/m.py")
            .replace("--- a/m.py", "--- a/pkg/m.py").replace("+++ b/m.py", "+++ b/pkg/m.py"))


def _spoil(diff):
    """Wrong counts in every hunk header and a wrong index line."""
    diff = re.sub(r"(?m)^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@", lambda m: f"@@ -{m.group(1)},99 +1,77 @@", diff)
    return re.sub(r"(?m)^index [0-9a-f]+\.\.[0-9a-f]+", "index 0000000..1111111", diff, count=1)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("seed", range(12))
def test_recounted_edit_is_gits_diff(tmp_path, seed):
    rng = random.Random(seed)
    lines = [f"line {k}" for k in range(rng.randint(3, 40))]
    post_lines = _edit(rng, lines)
    pre = "\n".join(lines) + ("\n" if seed % 3 else "")
    post = "\n".join(post_lines) + ("\n" if seed % 4 else "")
    want = _git_diff(tmp_path, pre, post)
    assert want.startswith("diff --git a/pkg/m.py b/pkg/m.py\nindex ")
    assert build_series.normalize_edit(_spoil(want), "pkg/m.py", pre) == want
    # without the upstream file only the headers are recounted
    assert build_series.normalize_edit(_spoil(want), "pkg/m.py", None) == _spoil(want).split("\n@@", 1)[0] + \
        "\n@@" + want.split("\n@@", 1)[1]


def test_a_hunk_that_does_not_match_upstream_is_refused():
    diff = "diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -2 +2 @@\n-b\n+B\n"
    with pytest.raises(build_series.BuildError, match=r"^x: stored hunk at line 2 does not match upstream$"):
        build_series.normalize_edit(diff, "x", "a\nc\n")
    with pytest.raises(build_series.BuildError, match=r"^x: stray lines after the hunks of the stored diff$"):
        build_series.normalize_edit(diff + "junk\n", "x", None)
    with pytest.raises(build_series.BuildError, match=r"^x: bad hunk header '@@ nonsense'$"):
        build_series.normalize_edit("diff --git a/x b/x\n@@ nonsense\n", "x", None)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("pre, post", [("a\nb", "A\nb"), ("a\nb\nc", "a\nB\nc"), ("x\n", "x")])
def test_final_newline_cases_match_git(tmp_path, pre, post):
    want = _git_diff(tmp_path, pre, post)
    assert build_series.normalize_edit(_spoil(want), "pkg/m.py", pre) == want


def test_sections_without_hunks_or_past_upstream_end():
    mode_only = "diff --git a/x b/x\nold mode 100644\nnew mode 100755\n"
    assert build_series.normalize_edit(mode_only, "x", "a\n") == mode_only
    past_end = "diff --git a/x b/x\nindex 1..2 100644\n--- a/x\n+++ b/x\n@@ -2 +2 @@\n-b\n+B\n"
    with pytest.raises(build_series.BuildError, match=r"^x: stored hunk at line 2 does not match upstream$"):
        build_series.normalize_edit(past_end, "x", "a\n")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("pre, post", [("", "a\nb\n"), ("a\nb\n", ""), ("", "a"), ("x", "")])
def test_edits_to_or_from_an_empty_file_match_git(tmp_path, pre, post):
    want = _git_diff(tmp_path, pre, post)
    assert "\n@@ " in want
    assert build_series.normalize_edit(_spoil(want), "pkg/m.py", pre) == want


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("pre, post", [("", "a\nb\n"), ("a\nb\n", ""), ("a\n", "b\nc\n"), ("x", "y\n")])
def test_whole_file_diff_is_gits_and_gives_back_the_original(tmp_path, pre, post):
    # no line in common: git's diff is one hunk that removes every old line and adds every new one
    assert build_series.whole_file_diff("pkg/m.py", pre, post) == _git_diff(tmp_path, pre, post)
    assert build_series.old_from_section(build_series.whole_file_diff("pkg/m.py", pre, post), "pkg/m.py") == pre


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("unified", [0, 1])
def test_insertions_and_deletions_without_context_match_git(tmp_path, unified):
    pre = "".join(f"line {k}\n" for k in range(12))
    post_lines = [f"line {k}" for k in range(12)]
    post_lines[3:3] = ["new a", "new b"]  # an insertion after line 3
    del post_lines[9]                     # a deletion of line 8
    post = "".join(line + "\n" for line in post_lines)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "m.py").write_text(pre, encoding="utf-8")
    (tmp_path / "b" / "m.py").write_text(post, encoding="utf-8")
    want = subprocess.run(["git", "diff", "--no-index", "--no-color", f"-U{unified}", "a/m.py", "b/m.py"],
                          cwd=tmp_path, capture_output=True, text=True).stdout
    assert want.count("\n@@ ") == 2
    assert build_series.normalize_edit(_spoil(want), "a/m.py", pre) == want
