"""Checkpoint folders: ``<save>/iter_0000004/`` per saved iteration plus a tracker.

An iteration folder holds ``dcp/`` (torch.distributed.checkpoint: the actor's
sharded model and optimizer state, written by every rank), ``rng/rank<k>.pt``
and ``trainer_state.json`` (iteration, KL coefficient, data position). The
tracker ``latest_checkpointed_iteration.txt`` is replaced atomically after
everything else is written, so a crash while saving leaves it naming the
previous complete checkpoint.
"""
import json
import os
from typing import Tuple

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
    os.replace(tmp, os.path.join(folder, STATE))


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
        text = open(tracker, encoding="utf-8").read().strip()
        if not text.isdigit():
            raise CheckpointError(f"{tracker} should hold an iteration number, holds {text!r}")
        iteration = int(text)
        folder = iteration_dir(load, iteration)
    for part in (os.path.join(DCP_DIR, ".metadata"), STATE):
        if not os.path.isfile(os.path.join(folder, part)):
            raise CheckpointError(f"checkpoint {folder!r} of iteration {iteration} is incomplete: "
                                  f"{part} is missing")
    return folder, iteration


def read_state(folder: str) -> dict:
    with open(os.path.join(folder, STATE), encoding="utf-8") as f:
        return json.load(f)
