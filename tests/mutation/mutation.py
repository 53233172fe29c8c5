#!/usr/bin/env python3
"""Mutation testing of the core modules with mutmut 3 (called by run.sh; see README.md here).

    mutation.py list [--all]                 modules run.sh runs (ready ones, or all)
    mutation.py run NAME [--fresh]           mutate one module, run its tests against every mutant (resumes)
    mutation.py run NAME --only GLOB...      only the mutants matching these globs (e.g. 'build_series.x__range*')
    mutation.py retest NAME                  re-run only the mutants that were not killed, keep the kills
    mutation.py summary [--markdown]         per-module table from the recorded results
    mutation.py survivors NAME [--diff]      survivors not listed in SURVIVORS.md

Each module runs in its own folder ``.mutation/<name>/`` (``MUTATION_WORK`` moves it): links to the
repository's top-level entries, a ``setup.cfg`` with the module's mutmut settings, and mutmut's
``mutants/`` copy, where the mutated file replaces the original. mutmut puts ``mutants/`` first on
``sys.path``, so the tests import the mutated code, not the editable install. ``history.jsonl`` there
records each run: when, how long, and the counts after it.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
MODULES = Path(os.environ.get("MUTATION_MODULES", HERE / "modules.toml"))
SURVIVORS = HERE / "SURVIVORS.md"
WORK = Path(os.environ.get("MUTATION_WORK", REPO / ".mutation")).resolve()
MUTMUT = os.environ.get("MUTMUT", "mutmut")

# mutmut's exit-code verdicts (mutmut/stats.py), folded into the table's columns
KILLED, SURVIVED, TIMEOUT, NO_TESTS, UNCHECKED, OTHER = "killed", "survived", "timeout", "no tests", "unchecked", "other"
_VERDICT = {1: KILLED, 3: KILLED, 0: SURVIVED, 5: NO_TESTS, 33: NO_TESTS, None: UNCHECKED,
            36: TIMEOUT, -24: TIMEOUT, 24: TIMEOUT, 152: TIMEOUT, 255: TIMEOUT}
# an entry of SURVIVORS.md: "- `mutant name` reason"
_LISTED = re.compile(r"^- `([^`]+)`\s*(.*)$")


def load_modules():
    with open(MODULES, "rb") as f:
        modules = tomllib.load(f)["module"]
    names = [m["name"] for m in modules]
    if len(set(names)) != len(names):
        raise SystemExit(f"{MODULES}: duplicate module names")
    return {m["name"]: m for m in modules}


def module(name):
    modules = load_modules()
    if name not in modules:
        raise SystemExit(f"unknown module {name!r}; modules.toml has {', '.join(modules)}")
    return modules[name]


def workdir(mod) -> Path:
    return WORK / mod["name"]


def source_path(mod) -> str:
    """The path mutmut mutates, relative to the run folder. A module the tests import by its bare name
    from ``import_root`` (build_series.py from patches/) is reached through the link ``src``: mutmut
    names modules after their path with a leading ``src.`` dropped, as the tests import them."""
    root = mod.get("import_root")
    return f"src/{Path(mod['path']).relative_to(root)}" if root else mod["path"]


def meta_path(mod) -> Path:
    return workdir(mod) / "mutants" / (source_path(mod) + ".meta")


def prepare(mod, fresh=False) -> Path:
    """The module's run folder: links to the repository, and a setup.cfg for mutmut."""
    work = workdir(mod)
    if fresh and (work / "mutants").exists():
        shutil.rmtree(work / "mutants")  # history.jsonl stays
    work.mkdir(parents=True, exist_ok=True)
    missing = [t for t in mod["tests"] + [mod["path"]] if not (REPO / t.split("::")[0]).exists()]
    if missing:
        raise SystemExit(f"{mod['name']}: modules.toml names missing files: {', '.join(missing)}")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    tops = sorted({line.split("/")[0] for line in tracked.splitlines() if line})
    root = mod.get("import_root")
    links = {top: REPO / top for top in tops if top != root}
    if root:
        links["src"] = REPO / root
        if (work / root).is_symlink():  # left by a run from before import_root: tests would import the original
            (work / root).unlink()
        # in mutants/, the import root is the mutated copy under src/ (tests resolve their __file__)
        (work / "mutants").mkdir(exist_ok=True)
        if not (work / "mutants" / root).is_symlink():
            (work / "mutants" / root).symlink_to("src")
    for name, target in links.items():
        if not (work / name).is_symlink():
            (work / name).symlink_to(target)
    # mutmut mutates only source_paths (the one file); also_copy brings the rest of the tree into mutants/
    also = sorted(t for t in links if t != ".gitignore")
    lines = ["[mutmut]", f"source_paths = {source_path(mod)}", "also_copy ="] + [f"    {t}" for t in also]
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in mod["tests"]]
    # no:unraisableexception: its gc.collect() at session end costs ~1.5 s per mutant with torch loaded
    lines += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -p", "    no:unraisableexception",
              # torch is not fork-safe once it has run: fork each mutant from a process that only imported
              "process_isolation = forkserver",
              "use_git_change_detection = false",
              # a mutant whose tests use 5x their usual CPU time is stuck (mutmut's default waits 15x)
              "timeout_multiplier = 5.0", ""]
    (work / "setup.cfg").write_text("\n".join(lines))
    return work


def verdicts(mod):
    """{mutant name: exit code} of the module's last run ({} before any)."""
    path = meta_path(mod)
    if not path.exists():
        return {}
    return json.loads(path.read_text())["exit_code_by_key"]


def listed_survivors():
    """{mutant name: reason} from SURVIVORS.md."""
    out = {}
    if SURVIVORS.exists():
        for line in SURVIVORS.read_text().splitlines():
            m = _LISTED.match(line.strip())
            if m:
                out[m.group(1)] = m.group(2)
    return out


def counts(mod):
    codes = verdicts(mod)
    listed = listed_survivors()
    c = Counter(_VERDICT.get(code, OTHER) for code in codes.values())
    equivalent = sum(1 for k, code in codes.items() if _VERDICT.get(code, OTHER) == SURVIVED and k in listed)
    row = {"mutants": len(codes), KILLED: c[KILLED], SURVIVED: c[SURVIVED] - equivalent, "equivalent": equivalent,
           TIMEOUT: c[TIMEOUT], NO_TESTS: c[NO_TESTS], UNCHECKED: c[UNCHECKED], OTHER: c[OTHER]}
    caught = row[KILLED] + row[TIMEOUT]
    checked = row["mutants"] - row[UNCHECKED]
    row["score"] = caught / (checked - equivalent) if checked > equivalent else None
    row["raw"] = caught / checked if checked else None
    return row


def _mutmut(work, args, log):
    env = dict(os.environ)
    # the mutated copy, also for the subprocesses tests start; one thread per test process. The folder
    # must exist before mutmut starts: Python caches a missing sys.path entry as unusable for good, and
    # the tests would then import the editable install instead.
    (work / "mutants").mkdir(exist_ok=True)
    env["PYTHONPATH"] = str(work / "mutants")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    cmd = ["nice", "-n", os.environ.get("MUTATION_NICE", "15"), MUTMUT, "run", "--max-children", "1", *args]
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd[:8])}{' ...' if len(cmd) > 8 else ''}\n")
        out.flush()
        return subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT).returncode


def _record(mod, kind, seconds, rc):
    row = counts(mod)
    entry = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "kind": kind, "seconds": round(seconds), "rc": rc,
             "tests": mod["tests"],
             **{k: v for k, v in row.items() if k not in ("score", "raw")}}
    with open(workdir(mod) / "history.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    return entry


def run(name, fresh=False, only=()):
    mod = module(name)
    work = prepare(mod, fresh)
    start = time.time()
    rc = _mutmut(work, list(only), work / "mutmut.log")
    kind = ("fresh run" if fresh else "run") + (f" of {' '.join(only)}" if only else "")
    entry = _record(mod, kind, time.time() - start, rc)
    print(f"{name}: rc={rc} in {entry['seconds']} s; {_line(mod)}", flush=True)
    if mod["path"].startswith("mindspeed_rl/"):
        where = subprocess.run([sys.executable, "-c", "import mindspeed_rl; print(mindspeed_rl.__file__)"],
                               cwd=work / "mutants", env={**os.environ, "PYTHONPATH": str(work / "mutants")},
                               capture_output=True, text=True).stdout.strip()
        if not where.startswith(str(work / "mutants")):
            print(f"{name}: the tests import mindspeed_rl from {where}, not the mutated copy", flush=True)
            return 1
    return rc


def retest(name):
    """Re-run the survivors, timeouts and untested mutants against the current tests. Kills are kept:
    a test added cannot revive a mutant, and mutmut would otherwise re-run the whole module when the
    test list changed. A function whose source changed loses its kills (mutmut re-runs its mutants)."""
    mod = module(name)
    work = prepare(mod)
    before = verdicts(mod)
    if not before:
        raise SystemExit(f"{name}: no results yet, use `run`")
    meta = meta_path(mod)
    hashes = json.loads(meta.read_text())["hash_by_function_name"]
    again = sorted(k for k, code in before.items() if _VERDICT.get(code, OTHER) != KILLED)
    start = time.time()
    rc = _mutmut(work, again, work / "mutmut.log") if again else 0
    data = json.loads(meta.read_text())
    kept = 0
    for key, code in before.items():
        func = key.split(".")[-1].rsplit("__mutmut_", 1)[0]
        if (_VERDICT.get(code, OTHER) == KILLED and key in data["exit_code_by_key"]
                and data["exit_code_by_key"][key] is None
                and data["hash_by_function_name"].get(func) == hashes.get(func) is not None):
            data["exit_code_by_key"][key] = code
            kept += 1
    meta.write_text(json.dumps(data, indent=4))
    entry = _record(mod, f"retest {len(again)}", time.time() - start, rc)
    print(f"{name}: retested {len(again)} (kept {kept} kills) rc={rc} in {entry['seconds']} s; {_line(mod)}",
          flush=True)
    return rc


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def _line(mod):
    r = counts(mod)
    return (f"{r['mutants']} mutants, {r[KILLED]} killed, {r[SURVIVED]} survived, {r['equivalent']} equivalent, "
            f"{r[TIMEOUT]} timeout, {r[NO_TESTS]} no tests, {r[UNCHECKED]} unchecked; score {_pct(r['score'])}")


def _history(mod):
    path = workdir(mod) / "history.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(markdown=False, include_all=False):
    modules = load_modules()
    head = ["module", "mutants", "killed", "survived", "equivalent", "timeout", "no tests", "unchecked", "score",
            "raw", "last run"]
    rows = []
    for name, mod in modules.items():
        if not meta_path(mod).exists() and not (include_all or mod.get("ready")):
            continue
        r = counts(mod)
        runs = _history(mod)
        rows.append([name, r["mutants"], r[KILLED], r[SURVIVED], r["equivalent"], r[TIMEOUT], r[NO_TESTS],
                     r[UNCHECKED], _pct(r["score"]), _pct(r["raw"]),
                     f"{runs[-1]['seconds'] / 60:.0f} min ({runs[-1]['kind']})" if runs else "-"])
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join(" --- " for _ in head) + "|")
        for row in rows:
            print("| " + " | ".join(map(str, row)) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        for row in [head] + rows:
            print("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    print("score = (killed + timeout) / (checked - equivalent); raw = (killed + timeout) / checked; "
          "checked = mutants - unchecked; equivalent = survivors listed in tests/mutation/SURVIVORS.md")
    alive = {k for mod in modules.values() for k, c in verdicts(mod).items() if _VERDICT.get(c, OTHER) == SURVIVED}
    recorded = {k for mod in modules.values() for k in verdicts(mod)}
    stale = sorted(k for k in listed_survivors() if k in recorded and k not in alive)
    if stale:
        print(f"SURVIVORS.md lists {len(stale)} mutants that no longer survive: {', '.join(stale)}")


def survivors(name, diff=False):
    mod = module(name)
    listed = listed_survivors()
    left = sorted(k for k, c in verdicts(mod).items() if _VERDICT.get(c, OTHER) in (SURVIVED, NO_TESTS)
                  and k not in listed)
    for key in left:
        print(key)
        if diff:
            out = subprocess.run([MUTMUT, "show", key], cwd=workdir(mod), capture_output=True, text=True)
            print("\n".join(out.stdout.splitlines()[1:]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("list")
    s.add_argument("--all", action="store_true")
    s = sub.add_parser("run")
    s.add_argument("name")
    s.add_argument("--fresh", action="store_true", help="drop earlier results first")
    s.add_argument("--only", nargs="+", default=(), metavar="GLOB", help="only the mutants matching these")
    s = sub.add_parser("retest")
    s.add_argument("name")
    s = sub.add_parser("summary")
    s.add_argument("--markdown", action="store_true")
    s.add_argument("--all", action="store_true")
    s = sub.add_parser("survivors")
    s.add_argument("name")
    s.add_argument("--diff", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "list":
        print("\n".join(n for n, m in load_modules().items() if args.all or m.get("ready")))
    elif args.cmd == "run":
        return run(args.name, args.fresh, args.only)
    elif args.cmd == "retest":
        return retest(args.name)
    elif args.cmd == "summary":
        summary(args.markdown, args.all)
    elif args.cmd == "survivors":
        survivors(args.name, args.diff)
    return 0


if __name__ == "__main__":
    sys.exit(main())
