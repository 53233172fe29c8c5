"""Ends what is left of a local Ray session once its driver is gone.

Ray ties the GCS and the raylet it starts to the driver (the kernel kills them with it), but the raylet's
DashboardAgent and RuntimeEnvAgent then keep trying the dead GCS for about a minute. ``init_ray`` starts this
file as a small process of its own session next to a local Ray: it waits until the driver dies or says it
is done (``shutdown_ray`` writes a line), then ends every Ray process (a program of Ray's package, or one
titled ``ray::...``) that holds a file of the Ray session folder open or names it on its command line, and
removes the /tmp folder the driver made for Ray.

Run as ``python ray_reaper.py DRIVER_PID SESSION_DIR RAY_PACKAGE_DIR [TEMP_DIR_TO_REMOVE]``; only the standard
library (Linux /proc)."""
import os
import select
import shutil
import signal
import sys
import time

SWEEP_ROUNDS = 25  # a process found in one round may have started a child before it died
SWEEP_PAUSE_S = 0.2


def _stat(pid: str):
    """(state, parent pid) of a process from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _family(root: int, parents: dict) -> set:
    """``root`` and its live descendants."""
    family, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in family} - family
        family |= more
        grew = bool(more)
    return family


def is_ray_process(cmdline: list, ray_dir: str) -> bool:
    """A program of Ray's package (its GCS, raylet, dashboard and monitors) or a process Ray titled ``ray::``
    (workers, actors, the node agents)."""
    package = os.path.abspath(ray_dir).rstrip("/") + "/"
    return bool(cmdline) and (cmdline[0].startswith("ray::") or any(package in arg for arg in cmdline[:3]))


def session_processes(session_dir: str, ray_dir: str, skip=(), keep_family_of: int = None) -> list:
    """Live Ray processes (``is_ray_process``; other than ``skip``, and other than ``keep_family_of`` and its
    descendants: a driver that still runs keeps Ray's log files open) whose command line names ``session_dir`` or
    that hold a file under it."""
    folder = os.path.abspath(session_dir).rstrip("/")
    stats = {int(n): _stat(n) for n in os.listdir("/proc") if n.isdigit()}
    live = {pid: st[1] for pid, st in stats.items() if st is not None and st[0] not in "ZX"}
    skip = set(skip) | (_family(keep_family_of, live) if keep_family_of in live else set())
    found = []
    for pid in live:
        if pid in skip:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().decode("utf-8", "replace").split("\0")
            if not is_ray_process(cmdline, ray_dir):
                continue
            if any(arg == folder or folder + "/" in arg for arg in cmdline):
                found.append(pid)
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target == folder or target.startswith(folder + "/"):
                    found.append(pid)
                    break
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def sweep(session_dir: str, ray_dir: str, driver: int = None, rounds: int = SWEEP_ROUNDS,
          pause: float = SWEEP_PAUSE_S) -> list:
    """SIGKILL the session's Ray processes (none of a ``driver`` that still runs) until none is found, at most
    ``rounds`` rounds. Returns the pids ended."""
    ended = []
    for _ in range(rounds):
        pids = session_processes(session_dir, ray_dir, skip={os.getpid()}, keep_family_of=driver)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            except OSError:
                pass
        time.sleep(pause)
    return ended


def wait_for_driver(pid: int, pipe_fd: int, poll_s: float = 1.0) -> str:
    """Block until the driver ``pid`` dies ('died') or writes a line or closes ``pipe_fd`` ('done')."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "died"
    except (AttributeError, OSError):  # no pidfd here: poll the pid
        pidfd = None
    while True:
        watched = [pipe_fd] + ([pidfd] if pidfd is not None else [])
        ready, _, _ = select.select(watched, [], [], None if pidfd is not None else poll_s)
        if pipe_fd in ready:
            return "done"  # a line, or end of file
        if pidfd is not None and pidfd in ready:
            return "died"
        if pidfd is None and not _alive(pid):
            return "died"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def main(argv) -> int:
    for sig in (signal.SIGHUP, signal.SIGINT):  # a closed terminal or Ctrl-C is the driver's to handle
        signal.signal(sig, signal.SIG_IGN)
    driver, session, ray_dir = int(argv[0]), argv[1], argv[2]
    remove = argv[3] if len(argv) > 3 else None
    wait_for_driver(driver, sys.stdin.fileno())
    sweep(session, ray_dir, driver)
    if remove:
        shutil.rmtree(remove, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
