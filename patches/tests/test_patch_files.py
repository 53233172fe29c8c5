"""Static checks of the upstream patch series in patches/mindspeed-rl/.

Runs without an upstream checkout: the patches are parsed here (unified
diffs in `git format-patch` mail form), checked for consistent hunks and the
files they are meant to touch, new Python files are compiled from their added
lines, and patches/apply.sh is exercised on directories that are not
MindSpeed-RL trees. verify_patched.py does the checks that need upstream.
"""
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import pytest

PATCHES = Path(__file__).resolve().parents[1]
SERIES_ROOT = PATCHES / "mindspeed-rl"
APPLY = PATCHES / "apply.sh"

FIGURE = {"7466375": "sources/images/remove_padding/dp_balance.png",
          "05a90d7": "docs/zh/figures/remove_padding/dp_balance.png"}

# files each patch must touch (the figure may be left out when it was not built)
EXPECTED = {
    "7466375": [
        {"mindspeed_rl/utils/seqlen_balancing.py", "mindspeed_rl/utils/partition_refine.py",
         "mindspeed_rl/utils/partition_exact.py", "mindspeed_rl/utils/workload.py",
         "mindspeed_rl/utils/dist_sync.py"},
        {"mindspeed_rl/trainer/utils/transfer_dock.py", "mindspeed_rl/trainer/utils/balance_plan.py"},
        {"mindspeed_rl/config_cls/rl_config.py", "mindspeed_rl/config_cls/validate_config.py",
         "mindspeed_rl/trainer/base.py", "mindspeed_rl/trainer/grpo_trainer_hybrid.py",
         "mindspeed_rl/workers/base_worker.py", "cli/train_grpo.py",
         "tests/st/configs/test_grpo_trainer_qwen25_7b_integrated.yaml"},
        {"docs/features/remove_padding.md"},
    ],
    "05a90d7": [
        {"mindspeed_rl/utils/seqlen_balancing.py", "mindspeed_rl/utils/partition_refine.py",
         "mindspeed_rl/utils/partition_exact.py", "mindspeed_rl/utils/workload.py",
         "mindspeed_rl/utils/dist_sync.py", "mindspeed_rl/utils/transfer_queue/tq_utils.py"},
        {"mindspeed_rl/trainer/utils/transfer_dock.py", "mindspeed_rl/trainer/utils/balance_plan.py"},
        {"mindspeed_rl/utils/transfer_queue/tq_mgr.py"},
        {"mindspeed_rl/config_cls/rl_config.py", "mindspeed_rl/config_cls/validate_config.py",
         "mindspeed_rl/trainer/utils/data_strategy.py", "mindspeed_rl/trainer/grpo_trainer_hybrid.py",
         "mindspeed_rl/trainer/dapo_trainer_hybrid.py", "mindspeed_rl/trainer/ppo_trainer_hybrid.py"},
        {"docs/zh/features/remove_padding.md"},
    ],
}

# the public interface the series must add (file -> added text that must appear)
INTERFACE = {
    "7466375": {
        "mindspeed_rl/config_cls/rl_config.py": ["self.use_dp_batch_balance = False"],
        "mindspeed_rl/trainer/base.py": ["use_dp_batch_balance: bool = False"],
        "mindspeed_rl/trainer/utils/transfer_dock.py": [
            "use_batch_seqlen_balance: bool = False", "self.batch_seqlen_balance_mapper = {",
            "def batch_seqlen_balance_sampler("],
        "mindspeed_rl/utils/seqlen_balancing.py": [
            "def heapq_partition(", "def get_seqlen_balanced_partitions(",
            "def rearrange_micro_batches(seqlen_list, max_token_len: int, dp_group=None,"],
        "mindspeed_rl/workers/base_worker.py": ["use_batch_seqlen_balance=self.rl_config.use_dp_batch_balance"],
        "tests/st/configs/test_grpo_trainer_qwen25_7b_integrated.yaml": ["use_dp_batch_balance: true"],
        "docs/features/remove_padding.md": ["use_dp_batch_balance: true"],
    },
    # head already has the flag; the series swaps the balancer and the per-call re-partition
    "05a90d7": {
        "mindspeed_rl/trainer/utils/transfer_dock.py": ["self.planner = BalancePlanner(",
                                                        "share = self.planner.next_share("],
        "mindspeed_rl/utils/seqlen_balancing.py": ["def heapq_partition(", "def get_seqlen_balanced_partitions(",
                                                   "sync_micro_batch_count(len(partitions), dp_group)"],
        "mindspeed_rl/utils/transfer_queue/tq_mgr.py": ["planner.next_share("],
        "mindspeed_rl/config_cls/rl_config.py": ['self.dp_balance_objective = "tokens"'],
    },
}

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")


@dataclass
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: List[str] = field(default_factory=list)


@dataclass
class FileDiff:
    path: str
    old_path: Optional[str]
    new_file: bool = False
    deleted: bool = False
    binary: bool = False
    hunks: List[Hunk] = field(default_factory=list)

    def added(self) -> List[str]:
        return [line[1:] for h in self.hunks for line in h.lines if line.startswith("+")]

    def removed(self) -> List[str]:
        return [line[1:] for h in self.hunks for line in h.lines if line.startswith("-")]


def parse_patch(text: str) -> List[FileDiff]:
    """Parse the diffs of one format-patch file; raises AssertionError on malformed input."""
    files: List[FileDiff] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines) and not lines[i].startswith("diff --git "):
        i += 1
    while i < len(lines):
        line = lines[i]
        if line.startswith("-- ") and line.strip() == "--":
            break  # mail signature
        assert line.startswith("diff --git "), f"line {i + 1}: expected 'diff --git', got {line[:60]!r}"
        m = re.match(r"^diff --git a/(\S+) b/(\S+)$", line)
        assert m, f"line {i + 1}: bad diff header {line!r}"
        fd = FileDiff(path=m.group(2), old_path=m.group(1))
        i += 1
        # extended headers
        while i < len(lines) and not lines[i].startswith(("--- ", "@@", "diff --git ", "GIT binary patch")):
            header = lines[i]
            if header.startswith("new file mode"):
                fd.new_file = True
            elif header.startswith("deleted file mode"):
                fd.deleted = True
            elif header.startswith("Binary files"):
                fd.binary = True
            i += 1
            if header == "" and (i >= len(lines) or not lines[i]):
                break
        if i < len(lines) and lines[i] == "GIT binary patch":
            fd.binary = True
            i += 1
            while i < len(lines) and not lines[i].startswith("diff --git ") and lines[i].strip() != "--":
                i += 1
            files.append(fd)
            continue
        if i < len(lines) and lines[i].startswith("--- "):
            old = lines[i][4:]
            assert lines[i + 1].startswith("+++ "), f"line {i + 2}: '+++' expected after '---'"
            new = lines[i + 1][4:]
            assert (old == "/dev/null") == fd.new_file, f"{fd.path}: '--- {old}' vs new file mode"
            assert new == f"b/{fd.path}" or fd.deleted, f"{fd.path}: '+++ {new}'"
            i += 2
        while i < len(lines) and lines[i].startswith("@@"):
            m = HUNK.match(lines[i])
            assert m, f"{fd.path}: bad hunk header {lines[i]!r}"
            h = Hunk(int(m.group(1)), int(m.group(2) or 1), int(m.group(3)), int(m.group(4) or 1))
            i += 1
            old_seen = new_seen = 0
            while i < len(lines) and (old_seen < h.old_len or new_seen < h.new_len):
                body = lines[i]
                tag = body[:1]
                if tag == "\\":
                    i += 1
                    continue
                assert tag in (" ", "+", "-"), f"{fd.path}: unexpected line in hunk: {body[:60]!r}"
                if tag != "+":
                    old_seen += 1
                if tag != "-":
                    new_seen += 1
                h.lines.append(body)
                i += 1
            while i < len(lines) and lines[i].startswith("\\"):
                i += 1
            assert (old_seen, new_seen) == (h.old_len, h.new_len), (
                f"{fd.path}: hunk @@ -{h.old_start},{h.old_len} +{h.new_start},{h.new_len} @@ "
                f"has {old_seen} old / {new_seen} new lines")
            fd.hunks.append(h)
        assert fd.hunks or fd.binary or fd.new_file or fd.deleted, f"{fd.path}: no hunks"
        files.append(fd)
        while i < len(lines) and not lines[i].startswith("diff --git ") and lines[i].strip() != "--":
            assert lines[i].strip() == "", f"{fd.path}: stray line after hunks: {lines[i][:60]!r}"
            i += 1
    return files


def series_dirs():
    return sorted(p for p in SERIES_ROOT.iterdir() if p.is_dir()) if SERIES_ROOT.is_dir() else []


def patch_files(series: Path):
    return sorted(series.glob("*.patch"))


ALL_PATCHES = [p for s in series_dirs() for p in patch_files(s)]


def test_both_series_present():
    assert {s.name for s in series_dirs()} == set(EXPECTED)
    for s in series_dirs():
        names = [p.name for p in patch_files(s)]
        assert names, f"{s.name}: no patches"
        assert [n[:4] for n in names] == [f"{k:04d}" for k in range(1, len(names) + 1)], names


@pytest.mark.parametrize("patch", ALL_PATCHES, ids=lambda p: f"{p.parent.name}/{p.name[:4]}")
def test_patch_parses(patch):
    text = patch.read_text(encoding="utf-8")
    assert text.startswith("From "), "not in git format-patch (mail) form"
    assert re.search(r"(?m)^Subject: \[PATCH", text), "no Subject line"
    files = parse_patch(text)
    assert files, "no file diffs"
    for fd in files:
        for h in fd.hunks:
            # context kept to what git needs: at most 3 lines before and after the change
            lead = next(k for k, line in enumerate(h.lines) if line[:1] in "+-")
            trail = next(k for k, line in enumerate(reversed(h.lines)) if line[:1] in "+-")
            assert lead <= 3 and trail <= 3, f"{fd.path}: hunk at {h.old_start} has more than 3 context lines"


@pytest.mark.parametrize("series", [s.name for s in series_dirs()])
def test_touches_expected_files(series):
    touched = []
    for p in patch_files(SERIES_ROOT / series):
        touched.append({fd.path for fd in parse_patch(p.read_text(encoding="utf-8"))})
    expected = EXPECTED[series]
    assert len(touched) == len(expected), f"{series}: {len(touched)} patches, expected {len(expected)}"
    for k, (got, want) in enumerate(zip(touched, expected), start=1):
        extra = got - want - {FIGURE[series]}
        assert want <= got and not extra, f"{series} patch {k:04d}: missing {want - got}, unexpected {extra}"
    all_paths = [path for t in touched for path in t]
    assert len(all_paths) == len(set(all_paths)), "a file is touched by two patches of one series"


@pytest.mark.parametrize("series", [s.name for s in series_dirs()])
def test_public_interface_added(series):
    added = {}
    for p in patch_files(SERIES_ROOT / series):
        for fd in parse_patch(p.read_text(encoding="utf-8")):
            added.setdefault(fd.path, []).extend(fd.added())
    for path, needles in INTERFACE[series].items():
        text = "\n".join(added.get(path, []))
        for needle in needles:
            assert needle in text, f"{series}: {path} does not add {needle!r}"


@pytest.mark.parametrize("patch", ALL_PATCHES, ids=lambda p: f"{p.parent.name}/{p.name[:4]}")
def test_python_added_lines(patch):
    for fd in parse_patch(patch.read_text(encoding="utf-8")):
        if not fd.path.endswith(".py"):
            continue
        added = fd.added()
        if fd.new_file:
            assert not fd.removed()
            compile("\n".join(added) + "\n", fd.path, "exec")
        # a whole-file hunk re-adds upstream's untouched lines: check only the lines we wrote
        kept = Counter(fd.removed())
        ours = []
        for line in added:
            if kept[line]:
                kept[line] -= 1
            else:
                ours.append(line)
        for line in ours:
            assert not CJK.search(line), f"{fd.path}: added line not in English: {line.strip()[:80]}"
            assert line == line.rstrip(), f"{fd.path}: trailing whitespace: {line.strip()[:80]}"
            assert "\t" not in line[: len(line) - len(line.lstrip())], f"{fd.path}: tab indentation"


@pytest.mark.parametrize("series", [s.name for s in series_dirs()])
def test_docs_section(series):
    doc = {"7466375": "docs/features/remove_padding.md", "05a90d7": "docs/zh/features/remove_padding.md"}[series]
    added = []
    for p in patch_files(SERIES_ROOT / series):
        for fd in parse_patch(p.read_text(encoding="utf-8")):
            if fd.path == doc:
                added += fd.added()
    text = "\n".join(added)
    assert CJK.search(text), "the docs section is written in Chinese"
    # the config key itself is already in head's section, so look for the options next to it
    assert ("use_dp_batch_balance: true" if series == "7466375" else "dp_balance_objective") in text
    for topic in ("每轮", "GRPO", "整除", "flops"):
        assert topic in text, f"docs section does not cover {topic!r}"


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
@pytest.mark.parametrize("patch", ALL_PATCHES, ids=lambda p: f"{p.parent.name}/{p.name[:4]}")
def test_git_numstat_agrees(patch, tmp_path):
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tmp_path.parent))
    out = subprocess.run(["git", "apply", "--numstat", str(patch)], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    stats = {}
    for row in out.stdout.splitlines():
        add, rem, path = row.split("\t")
        stats[path] = (add, rem)
    files = parse_patch(patch.read_text(encoding="utf-8"))
    assert set(stats) == {fd.path for fd in files}
    for fd in files:
        if fd.binary:
            assert stats[fd.path] == ("-", "-")
        else:
            assert stats[fd.path] == (str(len(fd.added())), str(len(fd.removed()))), fd.path


# ------------------------------------------------------------------ apply.sh

needs_tool = pytest.mark.skipif(shutil.which("git") is None and shutil.which("patch") is None,
                                reason="neither git nor patch installed")


def run_apply(*args, cwd=None):
    return subprocess.run(["bash", str(APPLY), *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@needs_tool
def test_apply_check_on_non_upstream_dir(tmp_path):
    (tmp_path / "README.md").write_text("not MindSpeed-RL\n")
    res = run_apply(tmp_path, "--check")
    assert res.returncode == 1, res.stdout + res.stderr
    msg = res.stderr
    assert "no patch series fits" in msg
    assert "7466375" in msg and "05a90d7" in msg, "must list the supported commits"
    assert "checkout" in msg or "worktree" in msg, "must say how to check one out"
    assert list(tmp_path.iterdir()) == [tmp_path / "README.md"], "--check changed the directory"


@needs_tool
def test_apply_check_on_fake_mindspeed_tree(tmp_path):
    (tmp_path / "mindspeed_rl" / "utils").mkdir(parents=True)
    (tmp_path / "mindspeed_rl" / "utils" / "seqlen_balancing.py").write_text("# something else\n")
    res = run_apply("--check", tmp_path)
    assert res.returncode == 1
    assert "no patch series fits" in res.stderr


@needs_tool
def test_apply_missing_dir(tmp_path):
    res = run_apply(tmp_path / "does-not-exist", "--check")
    assert res.returncode == 2
    assert "does not exist" in res.stderr


@needs_tool
@pytest.mark.parametrize("args", [[], ["--check"], ["--bogus", "."], [".", "--series", "deadbeef"], [".", "/tmp"]])
def test_apply_usage_errors(args, tmp_path):
    res = run_apply(*args, cwd=tmp_path)
    assert res.returncode == 2, (args, res.stdout, res.stderr)
    assert "usage:" in res.stderr


@needs_tool
def test_apply_help():
    res = run_apply("--help")
    assert res.returncode == 0
    assert "--check" in res.stderr
