#!/usr/bin/env python3
"""Build the upstream patch series in patches/mindspeed-rl/ and patches/verl/ from our package.

    python patches/build_series.py [--upstream GIT_DIR] [--verl-src DIR] [--package DIR] [--check]

Package-sourced files (series_spec.py) are our package files with their
declared adaptations; upstream edits are copied from patches/src/. The
upstream original of a whole-file hunk comes from ``--upstream`` (git show
<commit>:<path>) or else from the '-' lines of the committed patch.
``--check`` writes nothing and exits 1 naming every file that would change.
With ``--upstream`` the index lines of the stored upstream edits are
recomputed (their hunks applied to upstream's file) and written back;
``--verl-src`` (an unpacked verl sdist of the series' version) does the same
for the verl series.
"""
import argparse
import hashlib
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import series_spec as spec  # noqa: E402

REPO = HERE.parent
SRC = HERE / "src"
OUT = HERE / "mindspeed-rl"
VERL_OUT = HERE / "verl"
VERL_SRC = SRC / "verl"
HEADER = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n" \
         "From: dp-balance port <dev@example.invalid>\n"
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
STAT_WIDTH = 72  # git format-patch's mail width


class BuildError(Exception):
    pass


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


# ---------------------------------------------------------------- adaptations


def top_level_block(source: str, name: str, where: str) -> str:
    """Text of upstream's top-level ``def name`` up to the next top-level statement."""
    lines = source.split("\n")
    start = next((k for k, line in enumerate(lines) if line.startswith(f"def {name}(")), None)
    if start is None:
        raise BuildError(f"{where}: upstream has no top-level function {name!r}")
    end = start + 1
    while end < len(lines) and not re.match(r"(def |class |@|[A-Za-z_#])", lines[end]):
        end += 1
    return "\n".join(lines[start:end]).rstrip("\n") + "\n"


def adapt(text: str, pkg: "spec.Package", series: str, upstream: Optional[str]) -> str:
    """The package file ``text`` with ``pkg``'s adaptations applied in order."""
    for k, a in enumerate(pkg.adaptations, start=1):
        where = f"{series}: {pkg.path}: adaptation {k} ({a.why})"
        if isinstance(a, spec.Replace):
            found = text.count(a.old)
            if found != 1:
                raise BuildError(f"{where}: text to replace found {found} times, expected once: "
                                 f"{a.old.splitlines()[0]!r}")
            text = text.replace(a.old, a.new)
        elif isinstance(a, spec.Rehome):
            if a.old not in text:
                raise BuildError(f"{where}: text to rehome not found: {a.old!r}")
            text = text.replace(a.old, a.new)
        elif isinstance(a, spec.Append):
            text = text.rstrip("\n") + "\n" + a.text
        elif isinstance(a, (spec.KeepUpstream, spec.UpstreamFirstLine)):
            if upstream is None:
                raise BuildError(f"{where}: needs the upstream original (pass --upstream)")
            if isinstance(a, spec.UpstreamFirstLine):
                text = upstream.split("\n", 1)[0] + "\n" + text
            else:
                for name in a.names:
                    text = text.rstrip("\n") + "\n\n\n" + top_level_block(upstream, name, where)
        else:
            raise BuildError(f"{where}: unknown adaptation {a!r}")
    return text


# ---------------------------------------------------------------- diffs


def _range(start: int, count: int) -> str:
    return str(start) if count == 1 else f"{start},{count}"


def _whole(count: int) -> str:
    # a whole file's side of a hunk header; git writes an empty side as 0,0
    return _range(1, count) if count else "0,0"


NO_EOL = "\\ No newline at end of file"


def file_lines(text: str) -> List[str]:
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") or not text else lines


def hunk_lines(tag: str, text: str) -> str:
    out = "".join(f"{tag}{line}\n" for line in file_lines(text))
    return out + NO_EOL + "\n" if text and not text.endswith("\n") else out


def whole_file_diff(path: str, old: Optional[str], new: str) -> str:
    """A new-file diff, or one hunk that removes every old line and adds every new one."""
    new_lines = file_lines(new)
    new_id = blob_id(new.encode())[:7]
    if old is None:
        head = (f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex 0000000..{new_id}\n"
                f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +{_whole(len(new_lines))} @@\n")
        return head + hunk_lines("+", new)
    old_lines = file_lines(old)
    head = (f"diff --git a/{path} b/{path}\nindex {blob_id(old.encode())[:7]}..{new_id} 100644\n"
            f"--- a/{path}\n+++ b/{path}\n"
            f"@@ -{_whole(len(old_lines))} +{_whole(len(new_lines))} @@\n")
    return head + hunk_lines("-", old) + hunk_lines("+", new)


def split_sections(text: str) -> Dict[str, str]:
    """Per-file diff sections of a patch (or of one stored source), by path."""
    start = text.find("diff --git ")
    if start < 0:
        return {}
    out = {}
    for sec in re.split(r"(?m)^(?=diff --git )", text[start:]):
        if sec:
            out[re.match(r"diff --git a/\S+ b/(\S+)", sec).group(1)] = sec
    return out


def old_from_section(section: str, path: str) -> Optional[str]:
    """Upstream's original from a committed whole-file hunk (None for a new file)."""
    if "\nnew file mode" in section.split("@@", 1)[0]:
        return None
    hunks = section.split("\n@@ ")
    if len(hunks) != 2 or not hunks[1].startswith(("-1", "-0,0 ")):
        raise BuildError(f"{path}: the committed diff is not one whole-file hunk; pass --upstream")
    body = hunks[1].split("\n")[1:]
    old = "".join(line[1:] + "\n" for line in body if line.startswith("-"))
    removed = [k for k, line in enumerate(body) if line.startswith("-")]
    if removed and removed[-1] + 1 < len(body) and body[removed[-1] + 1] == NO_EOL:
        old = old[:-1]
    return old


def normalize_edit(section: str, path: str, pre: Optional[str]) -> str:
    """Recount hunk headers of a stored upstream edit; with ``pre`` (upstream's
    file) also check the hunks against it and recompute the index line."""
    if "\nGIT binary patch\n" in section:
        return section
    lines = section.split("\n")
    out, hunks, k, delta = [], [], 0, 0
    while k < len(lines) and not lines[k].startswith("@@"):
        out.append(lines[k])
        k += 1
    while k < len(lines) and lines[k].startswith("@@"):
        m = HUNK.match(lines[k])
        if not m:
            raise BuildError(f"{path}: bad hunk header {lines[k]!r}")
        old_start, tail = int(m.group(1)), m.group(5)
        body = []
        k += 1
        while k < len(lines) and lines[k][:1] in (" ", "+", "-", "\\"):
            body.append(lines[k])
            k += 1
        n_old = sum(1 for b in body if b[:1] in (" ", "-"))
        n_new = sum(1 for b in body if b[:1] in (" ", "+"))
        # git's new start: an insertion (no old lines) starts after old_start, a deletion to nothing names the line before
        new_start = old_start + delta + (n_old == 0) - (n_new == 0)
        out.append(f"@@ -{_range(old_start, n_old)} +{_range(new_start, n_new)} @@{tail}")
        out.extend(body)
        hunks.append((old_start, body))
        delta += n_new - n_old
    if any(line for line in lines[k:]):
        raise BuildError(f"{path}: stray lines after the hunks of the stored diff")
    out.extend(lines[k:])
    text = "\n".join(out)
    if pre is None:
        return text
    old_lines, new_lines, pos = file_lines(pre), [], 0
    for old_start, body in hunks:
        # a hunk with no old lines inserts after line old_start; otherwise its first old line is old_start
        first = old_start if not any(b[:1] in (" ", "-") for b in body) else old_start - 1
        new_lines += old_lines[pos:first]
        pos = first
        for b in body:
            if b[:1] in (" ", "-"):
                if pos >= len(old_lines) or old_lines[pos] != b[1:]:
                    raise BuildError(f"{path}: stored hunk at line {old_start} does not match upstream")
                pos += 1
            if b[:1] in (" ", "+"):
                new_lines.append(b[1:])
    untouched_tail = pos < len(old_lines)
    new_lines += old_lines[pos:]
    post = "".join(line + "\n" for line in new_lines)
    last = hunks[-1][1] if hunks else []
    ends_no_eol = len(last) > 1 and last[-1] == NO_EOL and last[-2][:1] in (" ", "+")
    if ends_no_eol or (untouched_tail and pre and not pre.endswith("\n")):
        post = post[:-1]
    ids = f"index {blob_id(pre.encode())[:7]}..{blob_id(post.encode())[:7]}"
    return re.sub(r"(?m)^index [0-9a-f]+\.\.[0-9a-f]+", ids, text, count=1)


# ---------------------------------------------------------------- mail form


def section_stats(section: str, path: str) -> Tuple[int, int, Optional[Tuple[int, int]], bool]:
    """(added, removed, binary sizes or None, new file) of one file diff."""
    head = section.split("\n@@", 1)[0]
    new_file = "\nnew file mode" in head
    if "\nGIT binary patch\n" in section:
        sizes = [int(s) for s in re.findall(r"(?m)^literal (\d+)$", section)]
        if len(sizes) != 2:
            raise BuildError(f"{path}: binary diff must hold two literal hunks")
        return 0, 0, (sizes[1], sizes[0]), new_file
    body = section.split("\n@@", 1)[1].split("\n") if "\n@@" in section else []
    # the file header ('--- a/..', '+++ b/..') is before the first hunk: every '+'/'-' line after it is a change
    added = sum(1 for line in body if line.startswith("+"))
    removed = sum(1 for line in body if line.startswith("-"))
    return added, removed, None, new_file


def _scale(it: int, width: int, max_change: int) -> int:
    return 0 if not it else 1 + (it * (width - 1) // max_change)


def diffstat(stats: List[Tuple[str, int, int, Optional[Tuple[int, int]], bool]]) -> str:
    """git's --stat for a mail (72 columns)."""
    max_len = max(len(p) for p, *_ in stats)
    max_change = max((a + r for _, a, r, b, _ in stats if b is None), default=0)
    number_width = max(len(str(max_change)), 3 if any(b for _, _, _, b, _ in stats) else 0)
    bin_width = max((14 + len(str(b[0])) + len(str(b[1])) for _, _, _, b, _ in stats if b), default=0)
    graph_width = max_change if max_change + 4 > bin_width else bin_width - 4
    name_width, width = max_len, STAT_WIDTH
    if name_width + number_width + 6 + graph_width > width:
        if graph_width > width * 3 // 8 - number_width - 6:
            graph_width = max(width * 3 // 8 - number_width - 6, 6)
        if name_width > width - number_width - 6 - graph_width:
            name_width = width - number_width - 6 - graph_width
        else:
            graph_width = width - number_width - 6 - name_width
    rows, ins, dels = [], 0, 0
    for path, add, rem, binary, _ in stats:
        name = path
        if len(path) > name_width:  # git keeps the tail from a '/' on
            tail = path[len(path) - name_width + 3:]
            name = "..." + (tail[tail.index("/"):] if "/" in tail else tail)
        if binary:
            rows.append(f" {name.ljust(name_width)} | {'Bin'.rjust(number_width)} {binary[0]} -> {binary[1]} bytes")
            continue
        ins, dels = ins + add, dels + rem
        a, r = add, rem
        if graph_width <= max_change:
            total = _scale(add + rem, graph_width, max_change)
            if total < 2 and add and rem:
                total = 2
            if add < rem:
                a = _scale(add, graph_width, max_change)
                r = total - a
            else:
                r = _scale(rem, graph_width, max_change)
                a = total - r
        rows.append(f" {name.ljust(name_width)} | {str(add + rem).rjust(number_width)} {'+' * a}{'-' * r}".rstrip())
    n = len(stats)
    summary = f" {n} file{'s' if n != 1 else ''} changed"
    if ins or not dels:
        summary += f", {ins} insertion{'s' if ins != 1 else ''}(+)"
    if dels or not ins:
        summary += f", {dels} deletion{'s' if dels != 1 else ''}(-)"
    rows.append(summary)
    rows += [f" create mode 100644 {p}" for p, _, _, _, new in stats if new]
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------- series


def upstream_file(git_dir: Optional[str], commit: str, path: str) -> Optional[str]:
    if git_dir is None:
        return None
    res = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], capture_output=True)
    try:
        return res.stdout.decode("utf-8") if res.returncode == 0 else None
    except UnicodeDecodeError:  # binary files are copied as stored
        return None


def source_tree_file(src_dir: Optional[str], path: str, version: str) -> Optional[str]:
    """``path`` of an unpacked source release (verl's sdist), None without one."""
    if src_dir is None:
        return None
    stamp = Path(src_dir) / "verl" / "version" / "version"
    have = stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else None
    if have != version:
        raise BuildError(f"--verl-src {src_dir}: verl version {have}, the series needs {version}")
    f = Path(src_dir) / path
    return f.read_text(encoding="utf-8") if f.is_file() else None


def build_step(commit: str, step: "spec.Step", package_dir: Path, git_dir: Optional[str],
               update_sources: bool, out_root: Path = OUT, src_root: Path = SRC, read_upstream=None) -> str:
    if read_upstream is None:
        def read_upstream(path):
            return upstream_file(git_dir, commit, path)
    step_src = src_root / commit / step.name[:4]
    message = (step_src / "message").read_text(encoding="utf-8")
    committed_path = out_root / commit / f"{step.name}.patch"
    committed = split_sections(committed_path.read_text(encoding="utf-8")) if committed_path.exists() else {}
    sections: Dict[str, str] = {}
    for pkg in step.package:
        src_file = package_dir / pkg.path
        if not src_file.is_file():
            raise BuildError(f"{commit}: {pkg.path}: not in the package ({package_dir})")
        old = None
        if pkg.upstream_has:
            old = read_upstream(pkg.target)
            if old is None:
                if pkg.target not in committed:
                    raise BuildError(f"{commit}: {pkg.target}: no upstream original (pass --upstream)")
                old = old_from_section(committed[pkg.target], pkg.target)
        new = adapt(src_file.read_text(encoding="utf-8"), pkg, commit, old)
        sections[pkg.target] = whole_file_diff(pkg.target, old, new)
    for diff in sorted(step_src.rglob("*.diff")):
        path = diff.relative_to(step_src).as_posix()[: -len(".diff")]
        stored = diff.read_text(encoding="utf-8")
        text = normalize_edit(stored, path, read_upstream(path))
        if update_sources and text != stored:
            diff.write_text(text, encoding="utf-8")
            print(f"updated {diff.relative_to(REPO)}")
        if path in sections:
            raise BuildError(f"{commit}: {path} is both package-sourced and an upstream edit")
        sections[path] = text
    if not sections:
        raise BuildError(f"{commit}: {step.name}: no files")
    order = sorted(sections)
    stats = [(p, *section_stats(sections[p], p)) for p in order]
    diffs = "".join(sections[p] if sections[p].endswith("\n") else sections[p] + "\n" for p in order)
    return HEADER + message + "---\n" + diffstat(stats) + "\n" + diffs


def build_all(package_dir: Path, git_dir: Optional[str] = None, update_sources: bool = False,
              verl_src: Optional[str] = None) -> Dict[Path, str]:
    out = {}
    for commit, steps in spec.SERIES.items():
        for step in steps:
            out[OUT / commit / f"{step.name}.patch"] = build_step(commit, step, package_dir, git_dir,
                                                                  update_sources)
    for version, steps in spec.VERL_SERIES.items():
        for step in steps:
            out[VERL_OUT / version / f"{step.name}.patch"] = build_step(
                version, step, package_dir, None, update_sources, VERL_OUT, VERL_SRC,
                lambda path, v=version: source_tree_file(verl_src, path, v))
    return out


def check(package_dir: Path, git_dir: Optional[str] = None, verl_src: Optional[str] = None) -> List[str]:
    """Patch files that differ from what the build writes (or are extra)."""
    built = build_all(package_dir, git_dir, verl_src=verl_src)
    stale = []
    for p, text in built.items():
        if not p.exists():
            stale.append(f"{p.relative_to(REPO)} (missing)")
            continue
        have = p.read_text(encoding="utf-8")
        if have != text:
            now, want = split_sections(have), split_sections(text)
            files = sorted(f for f in set(now) | set(want) if now.get(f) != want.get(f))
            stale.append(f"{p.relative_to(REPO)} ({', '.join(files) or 'message or diffstat'})")
    stale += [str(p.relative_to(REPO)) for root in (OUT, VERL_OUT) for p in root.glob("*/*.patch")
              if p not in built]
    return stale


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", help="git dir of upstream MindSpeed-RL (optional once bootstrapped)")
    parser.add_argument("--verl-src", help="unpacked verl sdist of the verl series' version (optional)")
    parser.add_argument("--package", default=str(REPO), help="repository holding our mindspeed_rl/ package")
    parser.add_argument("--check", action="store_true", help="compare with the committed patches, write nothing")
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = check(Path(args.package), args.upstream, args.verl_src)
            for path in stale:
                print(f"build_series: {path} differs from the generated series", file=sys.stderr)
            if stale:
                print("build_series: run `python patches/build_series.py` and commit the result", file=sys.stderr)
            return 1 if stale else 0
        for path, text in build_all(Path(args.package), args.upstream, update_sources=True,
                                    verl_src=args.verl_src).items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(REPO)}")
        return 0
    except BuildError as exc:
        print(f"build_series: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
