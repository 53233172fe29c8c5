"""Starting and joining Ray: a loopback-only local cluster unless RAY_ADDRESS is set. A local Ray gets room in
its health checks for a busy machine, its processes keep out of a closing terminal's SIGHUP, and a ray_reaper
process ends what is left of it when the driver dies."""
import atexit
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Dict, List, Optional

import ray

from mindspeed_rl.utils import ray_reaper
from mindspeed_rl.utils.ray_notices import drop_worker_death_notices

# Ray's longest socket is <temp_dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store and an
# AF_UNIX path holds at most 107 bytes on Linux (103 on macOS)
_SOCKET_PATH_MAX = 107
_SOCKET_SUFFIX = len("/session_2026-01-01_00-00-00_000000_") + 7 + len("/sockets/plasma_store")  # pid <= 7 digits
MAX_TEMP_DIR_LEN = _SOCKET_PATH_MAX - _SOCKET_SUFFIX

_OWN_TEMP_DIRS = []  # session folders this process made under /tmp (removed at shutdown or exit)
_REAPERS: List[subprocess.Popen] = []  # one ray_reaper process per local Ray this process started
REAPER_WAIT_S = 30.0  # how long shutdown waits for a reaper's last sweep
_atexit_registered = False


def _remove_own_temp_dirs() -> None:
    _stop_reapers()
    while _OWN_TEMP_DIRS:
        shutil.rmtree(_OWN_TEMP_DIRS.pop(), ignore_errors=True)


def _at_exit() -> None:
    # callers that end with a plain ray.shutdown() (or none) still leave no /tmp folder
    if _OWN_TEMP_DIRS or _REAPERS:
        ray.shutdown()
        _remove_own_temp_dirs()


def shutdown_ray() -> None:
    """``ray.shutdown()``, then end what is left of the local session and remove the folders ``init_ray`` made
    under /tmp."""
    ray.shutdown()
    _remove_own_temp_dirs()


def _start_reaper(remove: Optional[str]) -> Optional[subprocess.Popen]:
    """A ray_reaper process for the local Ray just started: it ends the session's processes once this process
    dies (a SIGKILL leaves Ray's node agents running for a minute) or ``shutdown_ray`` says it is done. Its own
    session: a closed terminal or Ctrl-C does not reach it. Linux only (it reads /proc)."""
    node = getattr(ray._private.worker, "_global_node", None)
    if node is None or not sys.platform.startswith("linux"):
        return None
    args = [sys.executable, "-I", "-S", ray_reaper.__file__, str(os.getpid()), node.get_session_dir_path(),
            os.path.dirname(os.path.abspath(ray.__file__))]
    proc = subprocess.Popen(args + ([remove] if remove else []), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    _REAPERS.append(proc)
    return proc


def _stop_reapers(wait: float = None) -> None:
    """Tell each reaper that this process is done and wait (bounded) for its last sweep."""
    wait = REAPER_WAIT_S if wait is None else wait
    while _REAPERS:
        proc = _REAPERS.pop()
        try:
            proc.stdin.write(b"done\n")
            proc.stdin.close()
        except OSError:  # it ended already
            pass
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:  # it ends by itself after its sweep
            pass


# Ray's GCS declares a node dead after health_check_failure_threshold failed checks in a row (one every
# health_check_period_ms, each allowed health_check_timeout_ms). Ray's defaults (3 s, 10 s, 5) declared the node
# of a local run dead on a heavily loaded 2-core machine; the node of a local Ray is this machine, so it gets
# minutes. A RAY_<name> variable in the environment wins.
LOCAL_HEALTH_CHECKS = {"health_check_period_ms": 10_000, "health_check_timeout_ms": 60_000,
                       "health_check_failure_threshold": 10}


def local_system_config(given: Optional[Dict] = None) -> Dict:
    """Ray's ``_system_config`` for a local Ray started here: ``LOCAL_HEALTH_CHECKS`` less the keys set by a
    ``RAY_<name>`` environment variable, then the caller's own ``given`` entries."""
    config = {k: v for k, v in LOCAL_HEALTH_CHECKS.items() if f"RAY_{k}" not in os.environ}
    config.update(given or {})
    return config


@contextmanager
def hangup_held():
    """SIGHUP blocked in this thread while it starts Ray's processes: they inherit the mask (as Ray blocks SIGINT
    in them), so the SIGHUP a closing terminal sends its whole process group reaches the driver only, whose
    handler shuts Ray down. A SIGHUP for this thread that comes meanwhile waits and is delivered at the end
    (another thread of the driver may take one at once: init_ray then shuts the new Ray down)."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    except (AttributeError, OSError, ValueError):  # no POSIX signal masks here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ray_path_problem(path: str) -> Optional[str]:
    """Why Ray cannot keep its session files under ``path`` (None when it can): Ray encodes its
    paths as ASCII, and its socket paths must fit in an AF_UNIX address."""
    if not path.isascii():
        return "Ray cannot take a path with non-ASCII characters"
    if len(path.encode("utf-8")) > MAX_TEMP_DIR_LEN:
        return f"longer than the {MAX_TEMP_DIR_LEN} bytes Ray's socket paths leave"
    return None


def session_dir_for(temp_dir: Optional[str]) -> Optional[str]:
    """``temp_dir`` as an absolute path when Ray can keep its session files there, else None."""
    if temp_dir is None:
        return None
    path = os.path.abspath(temp_dir)
    return None if ray_path_problem(path) else path


TEMP_PREFIX = "msrl_ray_"  # + the owner's pid + "_" + random: a folder of a dead owner is removed by the next run


def remove_stale_temp_dirs(base: str) -> List[str]:
    """Remove the session folders under ``base`` that a run made and could not remove (it was killed): those
    whose owner pid no longer runs. Returns the folders removed."""
    removed = []
    for name in os.listdir(base):
        pid = name[len(TEMP_PREFIX):].split("_", 1)[0] if name.startswith(TEMP_PREFIX) else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its owner still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's live process
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        removed.append(os.path.join(base, name))
    return removed


def _short_temp_dir() -> str:
    base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
    if ray_path_problem(base):
        raise ValueError(f"Ray's session files need a short ASCII folder: {base!r} (the temporary folder) is not "
                         f"one ({ray_path_problem(base)}); set TMPDIR to such a folder")
    remove_stale_temp_dirs(base)
    path = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}_", dir=base)
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_at_exit)
        _atexit_registered = True
    _OWN_TEMP_DIRS.append(path)
    return path


def init_ray(temp_dir: Optional[str] = None, num_cpus: Optional[int] = None, **kwargs) -> bool:
    """Join ``RAY_ADDRESS`` if set, else start a local Ray bound to 127.0.0.1.

    ``temp_dir`` keeps Ray's session files under the run's own folder when its
    absolute path is ASCII and has at most ``MAX_TEMP_DIR_LEN`` bytes (Ray's
    sockets live there); otherwise (a non-ASCII path says so in one line), and
    without ``temp_dir``, a short folder under /tmp is used and removed by
    ``shutdown_ray`` or at interpreter exit.
    Returns True when this call started Ray (the caller shuts it down).
    """
    if ray.is_initialized():
        return False
    drop_worker_death_notices()  # the launcher names a dead rank in one line
    _remove_own_temp_dirs()  # left by an earlier session ended with a plain ray.shutdown()
    if os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
        _with_retries(lambda: ray.init(address=address, **kwargs), f"could not join the Ray cluster at "
                      f"RAY_ADDRESS={address}")
        return True
    session = session_dir_for(temp_dir)
    made = None if session else _short_temp_dir()
    session = session or made
    if temp_dir is not None and not os.path.abspath(temp_dir).isascii():  # a long path moves silently
        print(f"note: Ray's session files go to {session}, not under {os.path.abspath(temp_dir)!r}: "
              f"{ray_path_problem(os.path.abspath(temp_dir))}", flush=True)
    os.makedirs(session, exist_ok=True)
    # a loopback-only cluster started here: Ray's notice about its token auth is noise on every run
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    system = local_system_config(kwargs.pop("_system_config", None))
    try:
        with hangup_held():
            _with_retries(lambda: ray.init(_node_ip_address="127.0.0.1", num_cpus=num_cpus, include_dashboard=False,
                                           _temp_dir=session, _system_config=system, **kwargs),
                          "a local Ray did not start")
        _start_reaper(made)
    except BaseException:  # a signal held while Ray started: the caller never learns that it started
        shutdown_ray()
        raise
    return True


class RayStartError(RuntimeError):
    """ray.init failed on every attempt."""


# attempts of ray.init and the waits between them (a busy machine can time a node's start out)
INIT_ATTEMPTS = 3
INIT_BACKOFF_S = 2.0


def _with_retries(start, what: str, attempts: int = None, backoff: float = None, sleep=time.sleep) -> None:
    """``start()`` up to ``attempts`` times, waiting ``backoff`` * 2**k between them (a failed
    attempt is shut down first); then one RayStartError line with the last error."""
    attempts = INIT_ATTEMPTS if attempts is None else attempts
    backoff = INIT_BACKOFF_S if backoff is None else backoff
    for attempt in range(1, attempts + 1):
        try:
            start()
            return
        except (TypeError, ValueError):  # wrong arguments: retrying cannot help
            raise
        except Exception as err:  # noqa: BLE001  (Ray raises plain Exception on a start timeout)
            try:
                ray.shutdown()
            except Exception:  # noqa: BLE001
                pass
            if attempt == attempts:
                text = " ".join(str(err).split())[:300]
                raise RayStartError(f"{what} after {attempts} attempts: {type(err).__name__}: {text}") from err
            wait = backoff * 2 ** (attempt - 1)
            print(f"warning: ray.init attempt {attempt} of {attempts} failed ({type(err).__name__}); "
                  f"retrying in {wait:g}s", flush=True)
            sleep(wait)
