"""One run per folder: a run owns its run folder and its save folder for its whole life.

``RunLock`` takes an exclusive ``flock`` on ``<folder>/.msrl_run.lock`` (atomic; the kernel drops
it when the process ends, however it ends) and writes the owner (pid, host, start time) into the
file. A second run asking for a held folder gets one line naming the owner. A lock file that names
an owner on this host but is not locked was left by a run that died without releasing it: it is taken
over and named. One that names another host is refused (flock may not reach across hosts and its pid
cannot be checked here): the line says so and how to free it. A clean release empties the file (it is never removed, so two runs cannot end up holding
locks on two different files of the same name)."""
import fcntl
import json
import os
import socket
import time
from typing import List, Optional, Sequence, Tuple

LOCK_FILE = ".msrl_run.lock"


class RunLockError(ValueError):
    """The folder is held by another live run."""


def _owner_text(owner: dict) -> str:
    started = owner.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}, started {when}"


def _read_owner(fd: int) -> Optional[dict]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        raw += chunk
    try:
        owner = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {"pid": "?", "host": "?", "raw": raw[:80].decode("utf-8", "replace")} if raw.strip() else None
    return owner if isinstance(owner, dict) else None


def pid_alive(pid) -> bool:
    """Whether process ``pid`` of this host runs (one we may not signal counts as running)."""
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """Exclusive ownership of ``folder`` (made if missing) by this process; ``what`` names the
    folder in messages (e.g. ``--output-dir``)."""

    def __init__(self, folder: str, what: str):
        self.folder, self.what = folder, what
        self.path = os.path.join(folder, LOCK_FILE)
        self.fd = None
        self.took_over: Optional[dict] = None  # the owner of a stale lock this one replaced

    def acquire(self) -> "RunLock":
        if os.path.exists(self.folder) and not os.path.isdir(self.folder):
            raise RunLockError(f"{self.what} {self.folder!r} is a file, not a folder")
        try:
            os.makedirs(self.folder, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise RunLockError(f"{self.what} {self.folder!r} cannot hold a run lock ({self.path}): "
                               f"{type(err).__name__}: {err.strerror or err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd) or {}
            os.close(fd)
            raise RunLockError(f"{self.what} {self.folder!r} is in use by another run ({_owner_text(owner)}; "
                               f"lock {self.path}): give this run its own folder, or wait for that run to "
                               f"end") from None
        except OSError as err:  # a file system without flock
            os.close(fd)
            raise RunLockError(f"{self.what} {self.folder!r}: cannot lock {self.path} "
                               f"({type(err).__name__}: {err.strerror or err})") from None
        previous = _read_owner(fd)
        if previous and previous.get("pid") != os.getpid():
            if previous.get("host") != socket.gethostname():
                # a lock of another host: flock may not reach across hosts (NFS), and its pid cannot be checked
                os.close(fd)
                raise RunLockError(f"{self.what} {self.folder!r} holds the lock of a run on another host "
                                   f"({_owner_text(previous)}; lock {self.path}), which cannot be checked from "
                                   f"here: give this run its own folder, or, if that run has ended, delete "
                                   f"{self.path} and start again")
            self.took_over = previous
            state = "its pid is not running" if not pid_alive(previous.get("pid")) else \
                "its pid runs now but does not hold the lock (another process)"
            print(f"note: {self.what} {self.folder!r}: a run left its lock without releasing it "
                  f"({_owner_text(previous)}; {state}); taken over", flush=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode("utf-8"), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)  # empty: released cleanly
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


class RunLocks:
    """Locks of several ``(what, folder)``, taken in order and released in reverse; a folder named
    twice (``save`` equal to the run folder) is locked once; an unset folder is skipped."""

    def __init__(self, folders: Sequence[Tuple[str, Optional[str]]]):
        self.locks: List[RunLock] = []
        seen = set()
        for what, folder in folders:
            if not folder:
                continue
            key = os.path.realpath(folder)
            if key not in seen:
                seen.add(key)
                self.locks.append(RunLock(folder, what))

    def __enter__(self):
        taken = []
        try:
            for lock in self.locks:
                taken.append(lock.acquire())
        except BaseException:
            for lock in reversed(taken):
                lock.release()
            raise
        return self

    def __exit__(self, *exc):
        for lock in reversed(self.locks):
            lock.release()
