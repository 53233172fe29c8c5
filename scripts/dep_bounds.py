"""The dependency ranges of requirements.txt (and the test extra) next to what an environment has.

    python scripts/dep_bounds.py --names                # the distribution names, for pip install -U
    python scripts/dep_bounds.py --report --suite-rc 0  # table: range, locked, installed, can the bound move
"""
import argparse
import os
import re
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PINNED_HERE = {"torch": "only the 2.13.0 CPU wheel is on this machine"}
TEST_EXTRA = ("pytest", "hypothesis")


def requirements():
    with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
        reqs = [Requirement(line.split("#", 1)[0].strip()) for line in f
                if line.split("#", 1)[0].strip()]
    import ast
    setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
    test = ast.literal_eval(re.search(r'"test":\s*(\[[^\]]*\])', setup).group(1))
    return reqs + [Requirement(t) for t in test]


def locked():
    out = {}
    with open(os.path.join(ROOT, "constraints.txt"), encoding="utf-8") as f:
        for line in f:
            if "==" in line and not line.startswith("#"):
                name, version = line.strip().split("==", 1)
                out[name] = version
    return out


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def report(suite_rc: int) -> str:
    lock = locked()
    rows = ["| dependency | range | locked (CI) | installed here | upper bound |", "| --- | --- | --- | --- | --- |"]
    for req in requirements():
        try:
            have = metadata.version(req.name).split("+", 1)[0]
        except metadata.PackageNotFoundError:
            have = "-"
        if req.name in PINNED_HERE:
            verdict = f"kept: {PINNED_HERE[req.name]}"
        elif have == "-":
            verdict = "not installed"
        elif req.specifier.contains(have, prereleases=True):
            verdict = "in range"
        elif suite_rc == 0:
            verdict = f"can move: the suite passed with {have}"
        else:
            verdict = f"outside the range and the suite failed (exit {suite_rc}): keep until fixed"
        rows.append(f"| {req.name} | {req.specifier} | {lock.get(_norm(req.name), '-')} | {have} | {verdict} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--names", action="store_true")
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--suite-rc", type=int, default=0)
    args = parser.parse_args(argv)
    if args.names:
        print(" ".join(r.name for r in requirements() if r.name not in PINNED_HERE and r.name not in TEST_EXTRA))
    if args.report:
        print(report(args.suite_rc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
