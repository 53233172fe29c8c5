"""build_series on hand-made input: the adaptations of a package file (their refusals name the series, the
file and the adaptation's number and reason; appending keeps the last line's own characters), upstream's
original read back from a whole-file hunk (empty, one-line and unterminated files, a patch file saved
without its final newline, diffs that are not one whole-file hunk), and normalize_edit on a binary edit and
on a stored edit without its final newline (both against git)."""
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PATCHES))
import build_series  # noqa: E402
import series_spec as spec  # noqa: E402

GIT = shutil.which("git")
PATH = "pkg/m.py"


def _pkg(*adaptations):
    return spec.Package(PATH, adaptations=adaptations)


def _refusal(text, pkg, upstream=None):
    with pytest.raises(build_series.BuildError) as err:
        build_series.adapt(text, pkg, "abc1234", upstream)
    return str(err.value)


# ------------------------------------------------------------------ adapt


def test_replace_refusal_names_the_adaptation_by_number_and_quotes_the_first_line():
    first = spec.Replace("x = 1\n", "x = 2\n", "set x")
    second = spec.Replace("def f():\n    return 0\n", "def f():\n    return 1\n", "f returns 1")
    # the first adaptation applies; the second finds nothing
    assert _refusal("x = 1\n", _pkg(first, second)) == (
        "abc1234: pkg/m.py: adaptation 2 (f returns 1): text to replace found 0 times, expected once: 'def f():'")
    assert _refusal("x = 1\nx = 1\n", _pkg(first)) == (
        "abc1234: pkg/m.py: adaptation 1 (set x): text to replace found 2 times, expected once: 'x = 1'")


def test_adaptations_apply_in_order():
    pkg = _pkg(spec.Replace("a = 1\n", "a = 2\n", "two"), spec.Replace("a = 2\n", "a = 3\n", "three"))
    assert build_series.adapt("a = 1\n", pkg, "abc1234", None) == "a = 3\n"


@pytest.mark.parametrize("last_line", ["from .consts import MAX", "a markdown line break  ", "tab\t"])
def test_appending_keeps_the_last_lines_characters(last_line):
    # only the file's final newlines give way to the appended text
    text = f"import os\n{last_line}\n\n"
    appended = build_series.adapt(text, _pkg(spec.Append("\nY = 2\n", "add Y")), "abc1234", None)
    assert appended == f"import os\n{last_line}\n\nY = 2\n"
    upstream = "import sys\n\n\ndef kept(a):\n    return a\n\n\nOTHER = 1\n"
    kept = build_series.adapt(text, _pkg(spec.KeepUpstream(("kept",), "keep it")), "abc1234", upstream)
    assert kept == f"import os\n{last_line}\n\n\ndef kept(a):\n    return a\n"


def test_upstream_adaptations_without_upstream_or_its_function_are_refused():
    first_line = spec.UpstreamFirstLine("copyright")
    assert _refusal("x = 1\n", _pkg(first_line)) == (
        "abc1234: pkg/m.py: adaptation 1 (copyright): needs the upstream original (pass --upstream)")
    keep = spec.KeepUpstream(("gone",), "keep gone")
    assert _refusal("x = 1\n", _pkg(first_line, keep), "# (c) upstream\nx = 0\n") == (
        "abc1234: pkg/m.py: adaptation 2 (keep gone): upstream has no top-level function 'gone'")
    assert build_series.adapt("x = 1\n", _pkg(first_line), "abc1234", "# (c) upstream\n# more\nx = 0\n") == \
        "# (c) upstream\nx = 1\n"


@dataclass(frozen=True)
class Rename:  # an adaptation kind build_series does not know
    why: str


def test_unknown_adaptation_is_refused_by_its_repr():
    assert _refusal("x = 1\n", _pkg(Rename("rename x"))) == (
        "abc1234: pkg/m.py: adaptation 1 (rename x): unknown adaptation Rename(why='rename x')")


# ------------------------------------------------------------------ old_from_section

OLDS = ["", "a", "a\n", "a\nb", "a\nb\n"]
NEWS = ["", "x", "x\ny\n"]


@pytest.mark.parametrize("old", OLDS)
@pytest.mark.parametrize("new", NEWS)
def test_old_from_a_whole_file_hunk_round_trips(old, new):
    section = build_series.whole_file_diff(PATH, old, new)
    assert build_series.old_from_section(section, PATH) == old
    # a patch file saved without its final newline: its last section reads the same
    patch = "Subject: x\n---\n" + section
    cut = build_series.split_sections(patch.rstrip("\n"))[PATH]
    assert not cut.endswith("\n")
    assert build_series.old_from_section(cut, PATH) == old


def test_new_file_has_no_original():
    assert build_series.old_from_section(build_series.whole_file_diff(PATH, None, "a\n"), PATH) is None


@pytest.mark.parametrize("hunks", [
    "@@ -1,2 +1,2 @@\n-a\n+A\n b\n@@ -9 +9 @@\n-i\n+I\n",  # two hunks, the first from line 1
    "@@ -3 +3 @@\n-c\n+C\n",                                 # one hunk, not from line 1
])
def test_a_committed_diff_that_is_not_one_whole_file_hunk_is_refused(hunks):
    section = f"diff --git a/{PATH} b/{PATH}\nindex 1111111..2222222 100644\n--- a/{PATH}\n+++ b/{PATH}\n" + hunks
    with pytest.raises(build_series.BuildError) as err:
        build_series.old_from_section(section, PATH)
    assert str(err.value) == "pkg/m.py: the committed diff is not one whole-file hunk; pass --upstream"


# ------------------------------------------------------------------ normalize_edit against git


def _git_diff(tmp_path, pre: bytes, post: bytes, *flags):
    for side, data in (("a", pre), ("b", post)):
        (tmp_path / side).mkdir(exist_ok=True)
        (tmp_path / side / "f").write_bytes(data)
    return subprocess.run(["git", "diff", "--no-index", "--no-color", *flags, "a/f", "b/f"], cwd=tmp_path,
                          capture_output=True, text=True).stdout


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_binary_edit_is_kept_as_stored_even_with_upstreams_file(tmp_path):
    # a file with NUL bytes is binary to git but valid UTF-8, so the upstream reader returns its text
    pre, post = b"head\x00" + bytes(range(1, 100)), b"head\x00" + bytes(range(99, 0, -1))
    stored = _git_diff(tmp_path, pre, post, "--binary")
    assert "\nGIT binary patch\n" in stored and stored.startswith("diff --git a/a/f b/b/f\nindex ")
    assert build_series.normalize_edit(stored, "a/f", pre.decode("utf-8")) == stored
    assert build_series.normalize_edit(stored, "a/f", None) == stored


@pytest.mark.skipif(GIT is None, reason="needs git")
@pytest.mark.parametrize("pre, post", [(b"a\nb\nc\n", b"a\nB\nc\n"), (b"a\nb\n", b"a\nb\nc\n"), (b"a\nb", b"a\n")])
def test_stored_edit_without_its_final_newline_is_recounted(tmp_path, pre, post):
    want = _git_diff(tmp_path, pre, post)
    spoiled = re.sub(r"(?m)^index [0-9a-f]+\.\.[0-9a-f]+", "index 0000000..1111111", want, count=1)
    assert spoiled != want
    # cut before the final newline (an editor that drops it): the same edit, as far as the text goes
    assert build_series.normalize_edit(spoiled[:-1], "a/f", pre.decode()) == want[:-1]
    assert build_series.normalize_edit(want[:-1], "a/f", None) == want[:-1]


def test_rehome_rewrites_every_path_and_refuses_a_file_without_one():
    rehome = spec.Rehome("pkg.home.", "pkg.utils.", "modules sit in utils")
    text = "from pkg.home.a import x\nfrom pkg.home.b import y\nz = 'pkg.homely'\n"
    assert build_series.adapt(text, _pkg(rehome), "abc1234", None) == (
        "from pkg.utils.a import x\nfrom pkg.utils.b import y\nz = 'pkg.homely'\n")
    msg = _refusal("import numpy\n", _pkg(rehome))
    assert "abc1234: pkg/m.py: adaptation 1 (modules sit in utils)" in msg and "'pkg.home.'" in msg
