"""Checkpoint folders: ``<save>/iter_0000004/`` per saved iteration plus a tracker.

An iteration folder holds ``dcp/`` (torch.distributed.checkpoint: the actor's
sharded model and optimizer state, written by every rank), ``rng/rank<k>.pt``
and ``trainer_state.json`` (iteration, KL coefficient, data position); a PPO
run's also ``critic_dcp/`` and ``critic_rng/`` (its critic group's state).
``Checkpointer`` writes a save into a temporary folder, fsyncs it,
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
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
from mindspeed_rl.utils.run_lock import pid_alive

TRACKER = "latest_checkpointed_iteration.txt"
STATE = "trainer_state.json"
DCP_DIR, RNG_DIR = "dcp", "rng"
CRITIC_DCP_DIR, CRITIC_RNG_DIR = "critic_dcp", "critic_rng"
# each worker group's state in an iteration folder: (sharded state, RNG streams); the actor's is always there
GROUP_DIRS = {"actor": (DCP_DIR, RNG_DIR), "critic": (CRITIC_DCP_DIR, CRITIC_RNG_DIR)}


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


def ascii_int(text: str) -> Optional[int]:
    """``text`` as a non-negative int when it is ASCII digits only, else None ('３' and '²' are digits
    to ``str.isdigit`` but not iteration numbers written by any save)."""
    return int(text) if text.isascii() and text.isdigit() else None


def _iter_number(name: str) -> Optional[int]:
    return ascii_int(name[5:]) if name.startswith("iter_") else None


def is_checkpoint(path: str) -> bool:
    """A save root with a tracker, or one iteration folder (else: plain HF weights)."""
    name = os.path.basename(os.path.normpath(path))
    return os.path.isfile(os.path.join(path, TRACKER)) or _iter_number(name) is not None


def _named(load: str) -> Tuple[str, int]:
    """(iteration folder, iteration) that ``load`` names: a save root's tracker, or one ``iter_XXXXXXX`` folder."""
    if not os.path.isdir(load):
        raise CheckpointError(f"checkpoint folder {load!r} does not exist")
    name = os.path.basename(os.path.normpath(load))
    if _iter_number(name) is not None:
        return load, _iter_number(name)
    tracker = os.path.join(load, TRACKER)
    if not os.path.isfile(tracker):
        raise CheckpointError(f"checkpoint folder {load!r} has no {TRACKER} (nothing was saved there, "
                              f"or name an iter_XXXXXXX folder)")
    try:
        with open(tracker, "rb") as f:
            text = f.read().decode("utf-8", "replace").strip()
    except OSError as err:
        raise CheckpointError(f"checkpoint tracker {tracker} cannot be read: {err.strerror or err}") from None
    iteration = ascii_int(text)
    if iteration is None:
        raise CheckpointError(f"checkpoint tracker {tracker} should hold an iteration number in ASCII digits, "
                              f"holds {text[:40]!r}")
    return iteration_dir(load, iteration), iteration


def find(load: str, weights_only: bool = False, deep: bool = True) -> Tuple[str, int]:
    """(iteration folder, iteration) to load from ``load`` (a save root or one
    iteration folder). ``deep`` checks every shard file and the trainer state
    (``damage``; not the state with ``weights_only``), else only that the save
    finished (``incomplete``). A damaged newest iteration of a save root falls
    back to the newest intact older one, and says so; a named iteration folder
    never falls back. Raises CheckpointError naming the file."""
    folder, iteration, _ = _find(load, weights_only, deep)
    return folder, iteration


def _find(load: str, weights_only: bool, deep: bool, say: bool = True) -> Tuple[str, int, Optional[dict]]:
    """``find``, with the chosen folder's trainer state as its check read it (None: not read); ``say``: print
    the fall-back to an older iteration (once per run: the load that uses it says it)."""
    folder, iteration = _named(load)
    check = (lambda f: _inspect(f, weights_only)) if deep else (lambda f: (incomplete(f), None))
    problem, state = check(folder)
    if problem is None:
        return folder, iteration, state
    if os.path.normpath(folder) == os.path.normpath(load):
        raise CheckpointError(f"checkpoint {folder!r} of iteration {iteration} cannot be loaded: {problem}")
    for older in sorted((i for i in _iterations(load) if i < iteration), reverse=True):
        older_problem, state = check(iteration_dir(load, older))
        if older_problem is None:
            if say:
                print(f"warning: checkpoint {folder!r} cannot be loaded ({problem}); resuming from the previous "
                      f"intact iteration {older}", flush=True)
            return iteration_dir(load, older), older, state
    raise CheckpointError(f"checkpoint {folder!r} of iteration {iteration} (named by the tracker) cannot be "
                          f"loaded: {problem}; no older intact iteration in {load!r}")


def resolve(load: str) -> Tuple[str, int]:
    """``find`` with the cheap check only (the save finished), silent: for config time (the resume that
    follows checks every file and says which iteration it falls back to)."""
    folder, iteration, _ = _find(load, weights_only=False, deep=False, say=False)
    return folder, iteration


def damage(folder: str, weights_only: bool = False) -> Optional[str]:
    """What makes a checkpoint folder unloadable, naming the file (None when intact): an unfinished
    save, a missing or unreadable trainer state (not needed with ``weights_only``), DCP metadata, or a
    shard file that is missing or shorter than the metadata says."""
    return _inspect(folder, weights_only)[0]


def _inspect(folder: str, weights_only: bool) -> Tuple[Optional[str], Optional[dict]]:
    """(``damage``'s answer, the trainer state it read: None with ``weights_only``)."""
    problem = incomplete(folder)
    if problem:
        return problem, None
    state = None
    if not weights_only:
        try:
            state = read_state(folder)
        except CheckpointError as err:
            return str(err), None
    for group in held_groups(folder):  # every worker group's shards: a damaged critic is a damaged checkpoint
        problem = _shards_damage(os.path.join(folder, GROUP_DIRS[group][0]))
        if problem:
            return problem, None
    return None, state


def held_groups(folder: str) -> Tuple[str, ...]:
    """The worker groups whose state ``folder`` holds: the actor's, and a PPO save's critic."""
    return ("actor",) + (("critic",) if os.path.isdir(os.path.join(folder, CRITIC_DCP_DIR)) else ())


def _shards_damage(dcp_dir: str) -> Optional[str]:
    """What makes a DCP folder unloadable, naming the file: unreadable metadata, a missing or short shard."""
    try:
        from torch.distributed.checkpoint import FileSystemReader
        metadata = FileSystemReader(dcp_dir).read_metadata()
    except Exception as err:  # noqa: BLE001  (pickle errors of a damaged file)
        return f"{os.path.join(dcp_dir, '.metadata')} is not readable ({type(err).__name__})"
    need: Dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        path = os.path.join(dcp_dir, name)
        if not os.path.isfile(path):
            return f"shard {path} is missing"
        have = os.path.getsize(path)
        if have < size:
            return f"shard {path} is truncated ({have} of {size} bytes)"
    return None


def incomplete(folder: str):
    """What a checkpoint folder lacks (None when complete)."""
    if not os.path.isdir(folder):
        return "the folder is missing"
    for part in (os.path.join(DCP_DIR, ".metadata"), STATE):
        if not os.path.isfile(os.path.join(folder, part)):
            return f"{part} is missing"
    return None


def _iterations(root: str):
    return sorted(i for i in map(_iter_number, os.listdir(root)) if i is not None)


def read_state(folder: str) -> dict:
    """The trainer state saved in ``folder``; CheckpointError naming the file when it is not
    readable JSON or holds no trainer state."""
    path = os.path.join(folder, STATE)
    try:
        with open(path, "rb") as f:
            state = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not readable JSON ({type(err).__name__}: "
                              f"{' '.join(str(err).split())[:120]})") from None
    if not isinstance(state, dict) or "kl_coef" not in state:
        raise CheckpointError(f"{path} holds no trainer state (no 'kl_coef')")
    return state


def _owner() -> str:
    """``<host>-<pid>`` of this process, in the names of its temporary save folders."""
    return f"{socket.gethostname().replace('-', '_')}-{os.getpid()}"


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
        if parts[2] == host and not pid_alive(int(parts[3])):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(name)
            print(f"removed a partial save left by a stopped run: {os.path.join(root, name)}", flush=True)
    return removed


FRESH_STATE = {"iteration": 0, "data_position": 0}


def driver_state(iteration: int, saved: dict) -> dict:
    """The driver's state to continue from a saved trainer state: ``iteration``,
    ``data_position`` (prompt batches taken; DAPO's refills take more than one per
    iteration), ``kl_coef`` and, when saved, ``algorithm``. Other saved keys (an older version's
    ``dock_round``) are ignored; a state without ``data_position`` counts one batch per iteration."""
    state = {"iteration": iteration, "kl_coef": saved["kl_coef"],
             "data_position": int(saved.get("data_position", iteration))}
    if "algorithm" in saved:  # what the checkpoint trained (a resume that changes it says so)
        state["algorithm"] = saved["algorithm"]
    return state


def load_kind(load: Optional[str], finetune: bool, no_load_optim: bool, no_load_rng: bool) -> Optional[str]:
    """What ``megatron_training.load`` asks for (the one place that decides it):
    'resume' (a checkpoint of ours, continued), 'finetune' (its weights only, from
    iteration 0), 'hf' (not a checkpoint of ours: HF weights to start from, allowed
    for a load that keeps no optimizer or RNG state: finetune, or no_load_optim and
    no_load_rng as upstream's configs give), None without a load. A load that is
    neither a checkpoint nor allowed as weights is 'resume' (``find`` names what is wrong)."""
    if load is None:
        return None
    if is_checkpoint(load):
        return "finetune" if finetune else "resume"
    return "hf" if finetune or (no_load_optim and no_load_rng) else "resume"


@dataclass(frozen=True)
class Resume:
    """A checkpoint of ours to load, found and checked before any worker starts (``open_resume``).
    ``state``: the driver's state to continue from (``FRESH_STATE`` for a finetune)."""
    folder: str
    iteration: int
    finetune: bool = False
    with_optimizer: bool = True
    with_rng: bool = True
    state: dict = field(default_factory=lambda: dict(FRESH_STATE))
    groups: Tuple[str, ...] = ("actor",)  # the worker groups that load from it (the others start afresh)
    fresh: Tuple[str, ...] = ()           # the run's groups it holds no state for (a finetune's new critic)


def open_resume(load: Optional[str], finetune: bool = False, no_load_optim: bool = False,
                no_load_rng: bool = False, world_size: Optional[int] = None,
                critic_world_size: Optional[int] = None) -> Optional[Resume]:
    """The checkpoint ``load`` names as a ``Resume`` (None when there is none to load: no load, or
    HF weights): found with every shard and the trainer state checked (``find``; the state read
    once), and for a resume what it asks for checked to be there (``check_resumable``, given
    ``world_size``, and ``critic_world_size`` for a run with a critic). A resume continues the run that
    saved it: its worker groups must be this run's (a PPO save's critic, none for GRPO or DAPO); a
    finetune loads the weights of the groups both have, the others start afresh. Raises CheckpointError
    naming the file or the key."""
    kind = load_kind(load, finetune, no_load_optim, no_load_rng)
    if kind not in ("resume", "finetune"):
        return None
    wanted = ("actor",) + (("critic",) if critic_world_size is not None else ())
    if kind == "finetune":
        folder, iteration, _ = _find(load, weights_only=True, deep=True)
        held = held_groups(folder)
        return Resume(folder, iteration, finetune=True, with_optimizer=False, with_rng=False,
                      groups=tuple(g for g in wanted if g in held), fresh=tuple(g for g in wanted if g not in held))
    folder, iteration, saved = _find(load, weights_only=False, deep=True)
    check_same_groups(folder, iteration, held_groups(folder), wanted)
    sizes = {"actor": world_size, "critic": critic_world_size}
    for group in wanted:
        if sizes[group] is not None:
            check_resumable(folder, not no_load_optim, not no_load_rng, sizes[group], group)
    return Resume(folder, iteration, with_optimizer=not no_load_optim, with_rng=not no_load_rng,
                  state=driver_state(iteration, saved), groups=wanted)


def check_same_groups(folder: str, iteration: int, held: Tuple[str, ...], wanted: Tuple[str, ...]) -> None:
    """A resume continues the run that saved ``folder``: the same worker groups, or one line saying which
    side has the critic and how to start from the checkpoint's weights instead."""
    if "critic" in held and "critic" not in wanted:
        raise CheckpointError(f"checkpoint {folder!r} (iteration {iteration}) was saved by a PPO run (it holds the "
                              f"critic's state, {CRITIC_DCP_DIR}/); this run has no critic, and resuming would drop "
                              f"it: resume with megatron_training.stage=ray_ppo, or set megatron_training.finetune: "
                              f"true to start this run from its actor's weights")
    if "critic" in wanted and "critic" not in held:
        raise CheckpointError(f"checkpoint {folder!r} (iteration {iteration}) holds no critic state "
                              f"({CRITIC_DCP_DIR}/ is missing: saved by a GRPO or DAPO run); this PPO run cannot "
                              f"resume it: set megatron_training.finetune: true to start PPO from its actor's "
                              f"weights with a new critic (critic_config's model)")


def resume_line(folder: str, iteration: int, weights_only: bool, with_optimizer: bool, with_rng: bool) -> str:
    """One line: what a load restored and what it left behind, and the key that left it."""
    if weights_only:
        return (f"loaded the weights of {folder} (iteration {iteration}) and started at iteration 0; left behind "
                f"(megatron_training.finetune: true): optimizer state, RNG state, iteration, KL coefficient and "
                f"data position")
    restored = ["weights"] + (["optimizer state"] if with_optimizer else []) + (["RNG state"] if with_rng else [])
    left = ([] if with_optimizer else ["optimizer state (megatron_training.no_load_optim: true)"]) + \
        ([] if with_rng else ["RNG state (megatron_training.no_load_rng: true)"])
    line = (f"resumed from {folder} at iteration {iteration}: restored {', '.join(restored)}, KL coefficient "
            f"and data position")
    if left:
        line += f"; left behind: {', '.join(left)}: the run does not continue exactly as an uninterrupted one"
    return line


def check_resumable(folder: str, with_optimizer: bool, with_rng: bool, world_size: int,
                    group: str = "actor") -> None:
    """Before any worker starts: the parts a resume asks for are in ``folder`` for worker ``group`` (optimizer
    state unless ``no_load_optim``; an RNG file per rank, for exactly ``world_size`` ranks, unless
    ``no_load_rng``). Raises CheckpointError naming what is missing and the key that does without it."""
    dcp_dir, rng_dir = (os.path.join(folder, d) for d in GROUP_DIRS[group])
    whose = "" if group == "actor" else f"the {group}'s "
    if with_optimizer:
        from torch.distributed.checkpoint import FileSystemReader
        try:
            keys = FileSystemReader(dcp_dir).read_metadata().state_dict_metadata
        except Exception as err:  # noqa: BLE001  (damage() names a damaged file first)
            raise CheckpointError(f"{os.path.join(dcp_dir, '.metadata')} is not readable "
                                  f"({type(err).__name__})") from None
        if not any(str(k).startswith("optim.") for k in keys):
            raise CheckpointError(f"checkpoint {folder!r} holds no {whose}optimizer state (saved with no_save_optim: "
                                  f"true?); set megatron_training.no_load_optim: true to resume with a fresh "
                                  f"optimizer")
    if with_rng:
        have = sorted(n for n in (os.listdir(rng_dir) if os.path.isdir(rng_dir) else []) if n.endswith(".pt"))
        missing = [k for k in range(world_size) if f"rank{k}.pt" not in have]
        extra = sorted(set(have) - {f"rank{k}.pt" for k in range(world_size)})
        if missing or extra:  # another rank count: its streams would not continue where they stopped
            detail = (f"no state for rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}" if missing
                      else f"no rank for {', '.join(n[:-3] for n in extra)}")
            raise CheckpointError(
                f"checkpoint {folder!r} holds {whose}RNG state for {len(have)} rank(s), this run has {world_size}"
                f"{'' if group == 'actor' else ' ' + group + ' rank(s)'} ({detail}); set "
                f"megatron_training.no_load_rng: true to resume with fresh random streams")


class Checkpointer:
    """Every stateful part of a run, one folder per iteration: the workers'
    sharded state and RNG streams (``save_workers(folder)`` /
    ``load_workers(folder, iteration, with_optimizer, with_rng)``) and the
    driver's state dict (trainer: iteration, KL coefficient, data position).
    Loading: ``open_resume`` (before any worker starts), then ``restore``."""

    def __init__(self, root: str, save_workers: Callable[[str], object] = None,
                 load_workers: Callable[[str, int, bool, bool], object] = None):
        self.root, self.save_workers, self.load_workers = root, save_workers, load_workers

    def restore(self, resume: Resume) -> dict:
        """Load ``resume`` (``open_resume``'s answer) into the workers, say in one line what was
        restored and what was left behind; returns the driver's state to continue from.
        A finetune loads the weights alone and starts at iteration 0."""
        if resume.finetune:
            self.load_workers(resume.folder, 0, False, False)
        else:
            self.load_workers(resume.folder, resume.iteration, resume.with_optimizer, resume.with_rng)
        line = resume_line(resume.folder, resume.iteration, resume.finetune, resume.with_optimizer, resume.with_rng)
        if resume.fresh:
            line += f"; no state for the {' and '.join(resume.fresh)}: it starts from its own model"
        print(line, flush=True)
        return dict(resume.state)

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
