"""build_series --check compares whole patch files: a stale commit message or diffstat is reported,
not only a stale diff; its diffstat is git format-patch's (checked against git on real commits)."""
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


@pytest.fixture
def series(tmp_path, monkeypatch):
    """The committed series copied under tmp_path; build_series reads and writes the copy."""
    for name in ("mindspeed-rl", "verl"):
        shutil.copytree(PATCHES / name, tmp_path / "patches" / name)
    monkeypatch.setattr(build_series, "REPO", tmp_path)
    monkeypatch.setattr(build_series, "OUT", tmp_path / "patches" / "mindspeed-rl")
    monkeypatch.setattr(build_series, "VERL_OUT", tmp_path / "patches" / "verl")
    return tmp_path


def _patches(root):
    return sorted((root / "patches").glob("*/*/*.patch"))


def _check(root):
    return build_series.check(PATCHES.parent)


def _edit(path, old, new):
    text = path.read_text(encoding="utf-8")
    assert text.count(old) >= 1, old
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


def _name(path, root):
    return str(path.relative_to(root))


def test_committed_copy_passes(series):
    assert _check(series) == []


def test_stale_subject_line_is_reported(series):
    patch = _patches(series)[0]
    _edit(patch, "Subject: [PATCH ", "Subject: [PATCH  ")
    assert _check(series) == [f"{_name(patch, series)} (message or diffstat)"]


def test_stale_message_body_is_reported(series):
    patch = _patches(series)[-1]
    head = patch.read_text(encoding="utf-8").split("\n---\n", 1)[0]
    last = head.rstrip("\n").rsplit("\n", 1)[1]
    _edit(patch, last + "\n---\n", last + " (old wording)\n---\n")
    assert _check(series) == [f"{_name(patch, series)} (message or diffstat)"]


def test_stale_diffstat_is_reported(series):
    patch = _patches(series)[1]
    text = patch.read_text(encoding="utf-8")
    summary = re.search(r"(?m)^ \d+ files? changed.*$", text).group(0)
    _edit(patch, summary, summary.replace("changed", "changed ", 1))
    assert _check(series) == [f"{_name(patch, series)} (message or diffstat)"]
    # a stat row's count
    patch = _patches(series)[2]
    row = re.search(r"(?m)^ \S+ +\| +(\d+) [+-]+$", patch.read_text(encoding="utf-8"))
    _edit(patch, row.group(0), row.group(0).replace(f"| {row.group(1)} ", f"| {int(row.group(1)) + 1} ", 1))
    assert [s.split(" (")[1] for s in _check(series)] == ["message or diffstat)"] * 2


def test_stale_diff_names_the_file(series):
    patch = _patches(series)[0]
    sections = build_series.split_sections(patch.read_text(encoding="utf-8"))
    path = sorted(sections)[0]
    first_added = next(line for line in sections[path].split("\n") if line.startswith("+") and
                       not line.startswith("+++"))
    _edit(patch, first_added + "\n", first_added + "  # edited\n")
    assert _check(series) == [f"{_name(patch, series)} ({path})"]


def test_missing_and_extra_patches_are_reported(series):
    gone, *_ = _patches(series)
    gone.unlink()
    extra = series / "patches" / "verl" / "0.9.1" / "0009-extra.patch"
    extra.write_text("stray\n", encoding="utf-8")
    assert _check(series) == [f"{_name(gone, series)} (missing)", _name(extra, series)]


def test_main_check_exit_status_and_messages(series, capsys):
    assert build_series.main(["--check", "--package", str(PATCHES.parent)]) == 0
    assert capsys.readouterr().err == ""
    patch = _patches(series)[0]
    _edit(patch, "Subject: [PATCH ", "Subject: [PATCH  ")
    assert build_series.main(["--check", "--package", str(PATCHES.parent)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"build_series: {_name(patch, series)} (message or diffstat) differs from the generated series",
                   "build_series: run `python patches/build_series.py` and commit the result"]


def test_main_writes_only_the_stale_patch(series, capsys):
    patch = _patches(series)[0]
    good = patch.read_text(encoding="utf-8")
    _edit(patch, "Subject: [PATCH ", "Subject: [PATCH  ")
    others = {p: p.stat().st_mtime_ns for p in _patches(series) if p != patch}
    assert build_series.main(["--package", str(PATCHES.parent)]) == 0
    assert capsys.readouterr().out == f"wrote {_name(patch, series)}\n"
    assert patch.read_text(encoding="utf-8") == good
    assert {p: p.stat().st_mtime_ns for p in others} == others
    assert build_series.main(["--check", "--package", str(PATCHES.parent)]) == 0


def test_build_error_is_one_line_and_exit_1(series, tmp_path, capsys):
    assert build_series.main(["--check", "--package", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("build_series: ") and "not in the package" in err and err.count("\n") == 1


# ------------------------------------------------------------------ diffstat against git


def _git(repo, *args, **kw):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, **kw)


def _commit_and_format(repo, files):
    """Commit ``files`` (path -> bytes or None to delete) on top of the repo; git format-patch's output."""
    for path, data in files.items():
        f = repo / path
        if data is None:
            f.unlink()
            continue
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "change")
    return _git(repo, "format-patch", "-1", "--stdout", "--no-signature", text=True).stdout


def _lines(n, tag=""):
    return "".join(f"line {tag}{k}\n" for k in range(n)).encode()


CASES = {
    "small": ({"a.py": _lines(3)}, {"a.py": _lines(3, "x") + _lines(2)}),
    "scaled graph": ({"pkg/big.py": _lines(200), "pkg/small.py": _lines(5)},
                     {"pkg/big.py": _lines(150, "y"), "pkg/small.py": _lines(4), "pkg/new.py": _lines(1)}),
    "long names": ({}, {"a/very/deeply/nested/folder/structure/with/a/rather/long/module_name.py": _lines(40),
                        "short.py": _lines(90), "b/" + "x" * 80 + ".py": _lines(2)}),
    "only deletions": ({"gone.py": _lines(7), "kept.py": _lines(4)}, {"gone.py": None, "kept.py": _lines(3)}),
    "binary": ({"img.png": bytes(range(256)) * 3}, {"img.png": bytes(range(255, -1, -1)) * 5, "t.py": _lines(2)}),
    "one line each": ({"x.py": b"a\n"}, {"x.py": b"b\n"}),
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
    stat = re.sub(r"(?m)^ delete mode .*\n", "", stat)  # not written by the build (it never deletes files)
    sections = build_series.split_sections(mail)
    stats = [(p, *build_series.section_stats(sections[p], p)) for p in sorted(sections)]
    assert build_series.diffstat(stats) == stat
