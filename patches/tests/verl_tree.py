"""verl source trees for the verl series' tests and benchmark.

``released_source`` downloads verl's sdist with pip (no dependencies) and
unpacks it; ``prepare_trees`` makes an original and a patched copy (the
patched one through apply.sh); ``load_seqlen_balancing`` imports a tree's
``verl.utils.seqlen_balancing`` without verl's package ``__init__`` files and
third-party stack: ``verl.protocol``, ``verl.utils.tensordict_utils`` and
``verl.utils.device`` get small stand-ins (the functions under test need
only ``index_select_tensor_dict`` and ``get_device_name``).
"""
import importlib
import os
import shutil
import subprocess
import sys
import tarfile
import types
from pathlib import Path
from typing import Optional

PATCHES = Path(__file__).resolve().parents[1]
APPLY = PATCHES / "apply.sh"
VERSION = "0.9.1"


class SourceUnavailable(RuntimeError):
    pass


def released_source(workdir: Path, version: str = VERSION) -> Path:
    """Unpacked verl-<version> sdist: from $VERL_SDIST (a .tar.gz or an
    unpacked directory) when set, else ``pip download``."""
    given = os.environ.get("VERL_SDIST")
    workdir.mkdir(parents=True, exist_ok=True)
    if given and Path(given).is_dir():
        return Path(given)
    if given:
        archive = Path(given)
    else:
        res = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                              "--disable-pip-version-check", "-q", f"verl=={version}", "-d", str(workdir)],
                             capture_output=True, text=True, timeout=300)
        found = sorted(workdir.glob(f"verl-{version}.tar.gz"))
        if res.returncode != 0 or not found:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise SourceUnavailable(f"pip download verl=={version} failed: {tail[0]}")
        archive = found[0]
    with tarfile.open(archive) as tar:
        tar.extractall(workdir, filter="data")
    tree = workdir / f"verl-{version}"
    if not (tree / "verl" / "utils" / "seqlen_balancing.py").is_file():
        raise SourceUnavailable(f"{archive} holds no verl-{version}/verl/utils/seqlen_balancing.py")
    return tree


def prepare_trees(workdir: Path, source: Path):
    """(original, patched) copies of ``source``; the patched one via apply.sh."""
    original, patched = workdir / "original", workdir / "patched"
    for dest in (original, patched):
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(source, dest)
    res = subprocess.run(["bash", str(APPLY), str(patched)], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"apply.sh failed on {patched}:\n{res.stdout}{res.stderr}")
    return original, patched, res


def _index_select_tensor_dict(batch, indices):
    return {key: value[list(indices)] for key, value in batch.items()}


def load_seqlen_balancing(tree: Path, fresh: bool = True):
    """``verl.utils.seqlen_balancing`` of ``tree`` (previously loaded verl
    modules are dropped first, so two trees can be loaded one after the other
    in one process; functions already taken keep working)."""
    if fresh:
        for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")]:
            del sys.modules[name]
    verl = types.ModuleType("verl")
    verl.__path__ = [str(tree / "verl")]
    utils = types.ModuleType("verl.utils")
    utils.__path__ = [str(tree / "verl" / "utils")]
    protocol = types.ModuleType("verl.protocol")
    protocol.DataProto = type("DataProto", (), {})
    tu = types.ModuleType("verl.utils.tensordict_utils")
    tu.index_select_tensor_dict = _index_select_tensor_dict
    device = types.ModuleType("verl.utils.device")
    device.get_device_name = lambda: "cpu"
    utils.tensordict_utils, utils.device, verl.utils, verl.protocol = tu, device, utils, protocol
    sys.modules.update({"verl": verl, "verl.utils": utils, "verl.protocol": protocol,
                        "verl.utils.tensordict_utils": tu, "verl.utils.device": device})
    return importlib.import_module("verl.utils.seqlen_balancing")


def find_verl_test_file() -> Optional[Path]:
    """verl's tests/utils/test_seqlen_balancing.py from $VERL_TEST_FILE (the
    sdist does not ship it; take it from a verl checkout of the release)."""
    given = os.environ.get("VERL_TEST_FILE")
    return Path(given) if given and Path(given).is_file() else None
