"""build_series on a small series of its own in tmp_path (an upstream git repository, a verl-like release,
a package file and two stored edits with wrong hunk headers): the build with --upstream takes the
originals from upstream and rewrites the stored edits to git's own diffs, --check writes nothing and names
every stale file, and the refusals of one step name the commit and the file."""
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

PATCHES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PATCHES))
import build_series  # noqa: E402
import series_spec as spec  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

UPSTREAM_M = "# (c) upstream\nimport os\n\n\ndef old():\n    return 0\n"
OURS_M = "import os\n\n\ndef new():\n    return 1\n"
E_LINES = [f"line {k}" for k in range(20)]
MESSAGE = "Subject: [PATCH 1/1] one\n\nBody.\n"


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _spoil(diff):
    """Wrong counts in every hunk header and a wrong index line, as a hand-edited stored edit has."""
    diff = re.sub(r"(?m)^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", lambda m: f"@@ -{m.group(1)},99 +1,77 @@", diff)
    return re.sub(r"(?m)^index [0-9a-f]+\.\.[0-9a-f]+", "index 0000000..1111111", diff, count=1)


def _repo_with(root, files):
    """A git repository at root holding files (path -> text), committed."""
    _git(root.parent, "init", "-q", str(root))
    _git(root, "config", "user.email", "t@example.invalid")
    _git(root, "config", "user.name", "t")
    for path, text in files.items():
        _write(root / path, text)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "upstream")


def _edit_diff(root, path, text):
    """git's diff of path in root against text (the work tree is restored after)."""
    _write(root / path, text)
    diff = _git(root, "diff", "--no-color", path)
    _git(root, "checkout", "--", path)
    return diff


@pytest.fixture
def tree(tmp_path, monkeypatch):
    up = tmp_path / "upstream"
    _repo_with(up, {"pkg/m.py": UPSTREAM_M, "up/e.py": "".join(line + "\n" for line in E_LINES)})
    commit = _git(up, "rev-parse", "--short=7", "HEAD").strip()
    edited = list(E_LINES)
    edited[3] = "line three"
    edited[15:15] = ["new a", "new b"]
    want_e = _edit_diff(up, "up/e.py", "".join(line + "\n" for line in edited))
    verl_src = tmp_path / "verl-src"
    _repo_with(verl_src, {"verl/version/version": "9.9.9\n", "verl/v.py": "v = 1\nw = 2\n"})
    want_v = _edit_diff(verl_src, "verl/v.py", "v = 1\nw = 3\n")
    src = tmp_path / "patches" / "src"
    e_diff, v_diff = src / commit / "0001" / "up" / "e.py.diff", src / "verl" / "9.9.9" / "0001" / "verl" / "v.py.diff"
    for path, text in ((src / commit / "0001" / "message", MESSAGE), (e_diff, _spoil(want_e)),
                       (src / "verl" / "9.9.9" / "0001" / "message", MESSAGE), (v_diff, _spoil(want_v))):
        _write(path, text)
    package = tmp_path / "package"
    _write(package / "pkg" / "m.py", OURS_M)
    monkeypatch.setattr(spec, "SERIES", {commit: [spec.Step("0001-one", (spec.Package(
        "pkg/m.py", upstream_has=True, adaptations=(spec.UpstreamFirstLine("copyright"),)),))]})
    monkeypatch.setattr(spec, "VERL_SERIES", {"9.9.9": [spec.Step("0001-two")]})
    monkeypatch.setattr(build_series, "REPO", tmp_path)
    monkeypatch.setattr(build_series, "OUT", tmp_path / "patches" / "mindspeed-rl")
    monkeypatch.setattr(build_series, "VERL_OUT", tmp_path / "patches" / "verl")
    monkeypatch.setattr(build_series, "VERL_SRC", src / "verl")
    real = build_series.build_step

    def build_step(commit, step, package_dir, git_dir, update_sources, out_root=None, src_root=None,
                   read_upstream=None):
        # the mindspeed-rl series is built with build_step's default folders (bound when it was defined):
        # point them at this tree
        return real(commit, step, package_dir, git_dir, update_sources, out_root or build_series.OUT,
                    src_root or src, read_upstream)

    monkeypatch.setattr(build_series, "build_step", build_step)
    return SimpleNamespace(root=tmp_path, commit=commit, git_dir=str(up / ".git"), verl_src=str(verl_src),
                           package=str(package), e_diff=e_diff, v_diff=v_diff, want_e=want_e, want_v=want_v,
                           patch=tmp_path / "patches" / "mindspeed-rl" / commit / "0001-one.patch",
                           verl_patch=tmp_path / "patches" / "verl" / "9.9.9" / "0001-two.patch")


def _args(t, *more):
    return ["--upstream", t.git_dir, "--verl-src", t.verl_src, "--package", t.package, *more]


def _rel(t, path):
    return str(path.relative_to(t.root))


def test_build_takes_upstreams_originals_and_rewrites_the_stored_edits(tree, capsys):
    t = tree
    assert build_series.main(_args(t)) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"updated {_rel(t, t.e_diff)}", f"updated {_rel(t, t.v_diff)}",
        f"wrote {_rel(t, t.patch)}", f"wrote {_rel(t, t.verl_patch)}"]
    # the stored edits are now git's diffs (hunk counts and index line)
    assert t.e_diff.read_text(encoding="utf-8") == t.want_e
    assert t.v_diff.read_text(encoding="utf-8") == t.want_v
    sections = build_series.split_sections(t.patch.read_text(encoding="utf-8"))
    assert sections["up/e.py"] == t.want_e
    assert build_series.old_from_section(sections["pkg/m.py"], "pkg/m.py") == UPSTREAM_M
    assert sections["pkg/m.py"].endswith("\n+# (c) upstream\n+" + OURS_M.replace("\n", "\n+")[:-1])
    assert build_series.split_sections(t.verl_patch.read_text(encoding="utf-8")) == {"verl/v.py": t.want_v}
    # built again: nothing to write, and the check passes with or without upstream
    assert build_series.main(_args(t)) == 0
    assert capsys.readouterr().out == ""
    assert build_series.main(_args(t, "--check")) == 0
    assert build_series.check(Path(t.package), None, t.verl_src) == []


def test_check_writes_nothing_and_reads_upstream(tree, capsys):
    t = tree
    assert build_series.main(_args(t, "--check")) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"build_series: {_rel(t, t.patch)} (missing) differs from the generated series",
        f"build_series: {_rel(t, t.verl_patch)} (missing) differs from the generated series",
        "build_series: run `python patches/build_series.py` and commit the result"]
    assert t.e_diff.read_text(encoding="utf-8") == _spoil(t.want_e)
    assert t.v_diff.read_text(encoding="utf-8") == _spoil(t.want_v)
    assert not t.patch.exists() and not t.verl_patch.exists()
    # without upstream and with no committed patch there is no original to diff against
    with pytest.raises(build_series.BuildError) as err:
        build_series.check(Path(t.package), None, t.verl_src)
    assert str(err.value) == f"{t.commit}: pkg/m.py: no upstream original (pass --upstream)"


def test_check_names_every_stale_file(tree, capsys):
    t = tree
    assert build_series.main(_args(t)) == 0
    good, good_verl = t.patch.read_text(encoding="utf-8"), t.verl_patch.read_text(encoding="utf-8")

    def check():
        return build_series.check(Path(t.package), t.git_dir, t.verl_src)

    # a missing patch does not stop the check of the next one
    t.patch.unlink()
    t.verl_patch.write_text(good_verl.replace("Body.", "Body, reworded."), encoding="utf-8")
    assert check() == [f"{_rel(t, t.patch)} (missing)", f"{_rel(t, t.verl_patch)} (message or diffstat)"]
    t.verl_patch.write_text(good_verl, encoding="utf-8")
    # two stale files of one patch, in path order
    t.patch.write_text(good.replace("+def new():", "+def newer():").replace("+line three", "+line 3!"),
                       encoding="utf-8")
    assert check() == [f"{_rel(t, t.patch)} (pkg/m.py, up/e.py)"]
    # a file the committed patch lacks
    sections = build_series.split_sections(good)
    t.patch.write_text(good.replace(sections["up/e.py"], ""), encoding="utf-8")
    assert check() == [f"{_rel(t, t.patch)} (up/e.py)"]
    t.patch.write_text(good, encoding="utf-8")
    assert check() == []


# ------------------------------------------------------------------ one step, built directly


def _step(tmp_path, edits, committed=None):
    """A step 0001-x of commit c0ffee0 under tmp_path: its message, stored edits (path -> text) and
    optionally a committed patch."""
    src, out = tmp_path / "src", tmp_path / "out"
    _write(src / "c0ffee0" / "0001" / "message", MESSAGE)
    for path, text in edits.items():
        _write(src / "c0ffee0" / "0001" / f"{path}.diff", text)
    if committed is not None:
        _write(out / "c0ffee0" / "0001-x.patch", committed)
    return src, out


def _build(tmp_path, package=(), edits=None, committed=None, upstream=None):
    root = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh step each call
    src, out = _step(root, edits or {}, committed)
    _write(root / "package" / "pkg" / "m.py", OURS_M)
    return build_series.build_step("c0ffee0", spec.Step("0001-x", tuple(package)), root / "package", None,
                                   False, out, src, lambda path: (upstream or {}).get(path))


def _refused(tmp_path, **kw):
    with pytest.raises(build_series.BuildError) as err:
        _build(tmp_path, **kw)
    return str(err.value)


EDIT = "diff --git a/up/e.py b/up/e.py\nindex 1111111..2222222 100644\n--- a/up/e.py\n+++ b/up/e.py\n" \
       "@@ -4 +4 @@\n-line 3\n+line three\n"
M_PATH = "pkg/m.py"


def test_step_refusals_name_the_commit_and_the_file(tmp_path):
    from_upstream = spec.Package(M_PATH, upstream_has=True)
    assert _refused(tmp_path, package=[from_upstream]) == "c0ffee0: pkg/m.py: no upstream original (pass --upstream)"
    two_hunks = ("diff --git a/pkg/m.py b/pkg/m.py\nindex 1111111..2222222 100644\n--- a/pkg/m.py\n"
                 "+++ b/pkg/m.py\n@@ -1 +1 @@\n-a\n+b\n@@ -5 +5 @@\n-c\n+d\n")
    assert _refused(tmp_path, package=[from_upstream], committed="Subject: x\n---\n" + two_hunks) == \
        "pkg/m.py: the committed diff is not one whole-file hunk; pass --upstream"
    renamed = spec.Package(M_PATH, adaptations=(spec.Replace("def gone():\n", "def here():\n", "rename"),))
    assert _refused(tmp_path, package=[renamed]) == (
        "c0ffee0: pkg/m.py: adaptation 1 (rename): text to replace found 0 times, expected once: 'def gone():'")
    assert _refused(tmp_path, edits={"up/e.py": EDIT}, upstream={"up/e.py": "line 0\nline 1\n"}) == \
        "up/e.py: stored hunk at line 4 does not match upstream"
    assert _refused(tmp_path, package=[spec.Package(M_PATH)], edits={"pkg/m.py": EDIT}) == \
        "c0ffee0: pkg/m.py is both package-sourced and an upstream edit"
    assert _refused(tmp_path) == "c0ffee0: 0001-x: no files"
    one_literal = ("diff --git a/up/b.bin b/up/b.bin\nindex 1111111..2222222 100644\n"
                   "GIT binary patch\nliteral 3\nabc\n\n")
    assert _refused(tmp_path, edits={"up/b.bin": one_literal}) == "up/b.bin: binary diff must hold two literal hunks"


def test_upstream_original_wins_over_the_committed_one(tmp_path):
    committed = "Subject: x\n---\n" + build_series.whole_file_diff(M_PATH, "stale = 1\n", OURS_M)
    mail = _build(tmp_path, package=[spec.Package(M_PATH, upstream_has=True)], committed=committed,
                  upstream={M_PATH: UPSTREAM_M})
    section = build_series.split_sections(mail)[M_PATH]
    assert section == build_series.whole_file_diff(M_PATH, UPSTREAM_M, OURS_M)
    # without upstream the committed original is used
    mail = _build(tmp_path, package=[spec.Package(M_PATH, upstream_has=True)], committed=committed)
    assert build_series.split_sections(mail)[M_PATH] == build_series.whole_file_diff(M_PATH, "stale = 1\n", OURS_M)


def test_a_stored_edit_without_final_newline_keeps_the_next_file_on_its_own_line(tmp_path):
    mail = _build(tmp_path, package=[spec.Package("pkg/m.py")], edits={"a/first.py": EDIT.replace(
        "up/e.py", "a/first.py").rstrip("\n")})
    assert "\n+line three\ndiff --git a/pkg/m.py b/pkg/m.py\nnew file mode 100644\n" in mail
    sections = build_series.split_sections(mail)
    assert sorted(sections) == ["a/first.py", "pkg/m.py"]
    assert sections["a/first.py"] == EDIT.replace("up/e.py", "a/first.py")
    assert mail.endswith("\n+    return 1\n")
