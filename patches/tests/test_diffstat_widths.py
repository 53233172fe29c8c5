"""build_series' diffstat against git format-patch where the widths decide: binary files only, binary
sizes that set the graph width next to a long name, a count of four digits beside a binary file, one
added and one removed line beside a scaled graph; and whole-file hunk headers (git's one-line ranges)."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PATCHES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PATCHES))
import build_series  # noqa: E402

GIT = shutil.which("git")


def _git(repo, *args, **kw):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, **kw)


def _commit_and_format(repo, files):
    for path, data in files.items():
        f = repo / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "change")
    return _git(repo, "format-patch", "-1", "--stdout", "--no-signature", text=True).stdout


def _lines(n, tag=""):
    return "".join(f"line {tag}{k}\n" for k in range(n)).encode()


LONG = "pkg/" + "n" * 43 + ".py"  # 50 characters
CASES = {
    "binary only": ({"a.bin": bytes(range(256))}, {"a.bin": bytes(range(255, -1, -1)) * 2}),
    # Bin 2048 -> 512 bytes sets the graph width (14 + 4 + 3 - 4 = 17); with the 50-character name the
    # row is 72 columns + 4: the name is cut to fit
    "binary sizes and a long name": ({"b.bin": bytes(range(256)) * 8, LONG: _lines(3)},
                                     {"b.bin": bytes(range(255, -1, -1)) * 2, LONG: _lines(1) + _lines(2, "z")}),
    "four-digit count beside binary": ({"c.bin": bytes(range(256)), "big.py": _lines(10)},
                                       {"c.bin": bytes(range(255, -1, -1)), "big.py": _lines(1200, "q")}),
    "one each beside a scaled graph": ({"d.py": _lines(300), "e" * 40 + ".py": _lines(2)},
                                       {"d.py": _lines(300, "w"), "e" * 40 + ".py": _lines(1) + b"other\n"}),
}


@pytest.mark.skipif(GIT is None, reason="needs git")
@pytest.mark.parametrize("case", sorted(CASES))
def test_diffstat_is_git_format_patch(tmp_path, case):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")
    before, after = CASES[case]
    _commit_and_format(repo, dict(before, **{"keep.txt": b"base\n"}))
    mail = _commit_and_format(repo, after)
    stat = mail.split("\n---\n", 1)[1].split("\n\ndiff --git ", 1)[0] + "\n"
    sections = build_series.split_sections(mail)
    stats = [(p, *build_series.section_stats(sections[p], p)) for p in sorted(sections)]
    assert build_series.diffstat(stats) == stat


def test_whole_file_hunk_headers_use_git_ranges():
    assert "\n@@ -0,0 +1 @@\n+a\n" in build_series.whole_file_diff("x.py", None, "a\n")
    assert "\n@@ -1,2 +1 @@\n" in build_series.whole_file_diff("x.py", "a\nb\n", "c\n")
    assert "\n@@ -1 +1,2 @@\n" in build_series.whole_file_diff("x.py", "a\n", "b\nc\n")
