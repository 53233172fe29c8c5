"""Checkpoint folders: ``<save>/iter_0000004/`` per saved iteration plus a tracker.

An iteration folder holds ``dcp/`` (torch.distributed.checkpoint: the actor's
sharded model and optimizer state, written by every rank), ``rng/rank<k>.pt``
and ``trainer_state.json`` (iteration, KL coefficient, data position, dock
round). ``Checkpointer`` writes a save into a temporary folder, fsyncs it,
renames it into place and only then replaces the tracker
``latest_checkpointed_iteration.txt`` (atomically): no save ever writes into a
folder the tracker names or into a complete checkpoint, so a crash at any
point leaves a loadable checkpoint.
"""
import json
import os
import random
import shutil
import socket
import uuid
from typing import Callable, Tuple

import numpy as np
import torch

TRACKER = "latest_checkpointed_iteration.txt"
STATE = "trainer_state.json"
DCP_DIR = "dcp"


class CheckpointError(ValueError):
    """A checkpoint to load is missing or incomplete."""


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def write_tracker(root: str, iteration: int) -> None:
    tmp = os.path.join(root, f".{TRACKER}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(f"{iteration}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(root, TRACKER))


def write_state(folder: str, state: dict) -> None:
    tmp = os.path.join(folder, f".{STATE}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(state, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(folder, STATE))


def fsync_tree(folder: str) -> None:
    """Flush every file and folder under ``folder`` to disk."""
    for root, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _accelerator(device: torch.device):
    """torch.cuda / torch.npu / ... for an accelerator device, None on CPU."""
    return None if device.type == "cpu" else getattr(torch, device.type, None)


def capture_rng(device: torch.device) -> dict:
    """This process's random streams: python, numpy, torch CPU and the device's (cuda, npu, ...)."""
    state = {"cpu": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    accel = _accelerator(device)
    if accel is not None:
        state[device.type] = accel.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "python" in state:
        random.setstate(state["python"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    accel = _accelerator(device)
    if accel is not None and device.type in state:
        accel.set_rng_state(state[device.type], device)


def is_checkpoint(path: str) -> bool:
    """A save root with a tracker, or one iteration folder (else: plain HF weights)."""
    name = os.path.basename(os.path.normpath(path))
    return os.path.isfile(os.path.join(path, TRACKER)) or (name.startswith("iter_") and name[5:].isdigit())


def resolve(load: str) -> Tuple[str, int]:
    """(iteration folder, iteration) of ``load``: a save root (its tracker names
    the latest iteration) or one ``iter_XXXXXXX`` folder. Raises CheckpointError
    naming the folder and what is missing."""
    if not os.path.isdir(load):
        raise CheckpointError(f"checkpoint folder {load!r} does not exist")
    name = os.path.basename(os.path.normpath(load))
    if name.startswith("iter_") and name[5:].isdigit():
        folder, iteration = load, int(name[5:])
    else:
        tracker = os.path.join(load, TRACKER)
        if not os.path.isfile(tracker):
            raise CheckpointError(f"checkpoint folder {load!r} has no {TRACKER} (nothing was saved there, "
                                  f"or name an iter_XXXXXXX folder)")
        with open(tracker, "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
        if not text.isdigit():
            raise CheckpointError(f"{tracker} should hold an iteration number, holds {text!r}")
        iteration = int(text)
        folder = iteration_dir(load, iteration)
    problem = incomplete(folder)
    if problem is None:
        return folder, iteration
    if folder == load:  # an iteration folder named by the user: no fallback
        raise CheckpointError(f"checkpoint {folder!r} of iteration {iteration} is incomplete: {problem}")
    older = [i for i in _iterations(load) if i < iteration and incomplete(iteration_dir(load, i)) is None]
    if not older:
        raise CheckpointError(f"checkpoint {folder!r} of iteration {iteration} (named by the tracker) is "
                              f"incomplete: {problem}; no older complete iteration in {load!r}")
    print(f"warning: checkpoint {folder!r} is incomplete ({problem}); resuming from iteration {older[-1]}",
          flush=True)
    return iteration_dir(load, older[-1]), older[-1]


def incomplete(folder: str):
    """What a checkpoint folder lacks (None when complete)."""
    if not os.path.isdir(folder):
        return "the folder is missing"
    for part in (os.path.join(DCP_DIR, ".metadata"), STATE):
        if not os.path.isfile(os.path.join(folder, part)):
            return f"{part} is missing"
    return None


def _iterations(root: str):
    return sorted(int(n[5:]) for n in os.listdir(root) if n.startswith("iter_") and n[5:].isdigit())


def read_state(folder: str) -> dict:
    path = os.path.join(folder, STATE)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"checkpoint state {path!r} could not be read: {err}") from err


def _owner() -> str:
    """``<host>-<pid>`` of this process, in the names of its temporary save folders."""
    return f"{socket.gethostname().replace('-', '_')}-{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_partial_saves(root: str) -> list:
    """Remove ``.tmp-*`` / ``.old-*`` folders left in ``root`` by a save whose
    process (on this host) is gone, e.g. a driver killed mid-save; a live
    process's folders, and other hosts', are left alone. Returns what was removed."""
    host = socket.gethostname().replace("-", "_")
    removed = []
    for name in sorted(os.listdir(root)):
        parts = name.split("-")
        if not (name.startswith((".tmp-iter_", ".old-iter_")) and len(parts) == 5 and parts[3].isdigit()):
            continue
        if parts[2] == host and not _alive(int(parts[3])):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
            print(f"removed a partial save left by a stopped run: {os.path.join(root, name)}", flush=True)
    return removed


class Checkpointer:
    """Saves every stateful part of a run in one folder per iteration: the
    workers' sharded state and RNG streams (``save_workers(folder)``) and the
    driver's state dict (trainer: iteration, KL coefficient, data position,
    dock round). Loading: ``resolve`` the folder, ``read_state``, then the
    workers' ``load_checkpoint``."""

    def __init__(self, root: str, save_workers: Callable[[str], object]):
        self.root, self.save_workers = root, save_workers

    def save(self, iteration: int, state: dict) -> str:
        """Write iteration ``iteration``: into a temporary folder, fsync, rename
        into place (an existing folder of that iteration is replaced only
        then), then the tracker."""
        os.makedirs(self.root, exist_ok=True)
        remove_stale_partial_saves(self.root)
        final = iteration_dir(self.root, iteration)
        tmp = os.path.join(self.root, f".tmp-{os.path.basename(final)}-{_owner()}-{uuid.uuid4().hex[:8]}")
        os.makedirs(tmp)
        try:
            self.save_workers(tmp)
            write_state(tmp, dict(state, iteration=iteration))
            fsync_tree(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        old = None
        if os.path.exists(final):  # an older run's save of this iteration: moved aside, removed after
            old = os.path.join(self.root, f".old-{os.path.basename(final)}-{_owner()}-{uuid.uuid4().hex[:8]}")
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        write_tracker(self.root, iteration)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return final
