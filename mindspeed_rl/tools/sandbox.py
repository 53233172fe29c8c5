"""Runs model-written Python in a bubblewrap (bwrap) sandbox on the local machine.

Each call starts ``bwrap`` with its own pid, net, ipc, uts (and, for a non-root caller, user) namespaces.
Inside it sees read-only ``/usr`` (with ``/bin``, ``/lib``... as on the host), a few ``/etc`` files the
dynamic loader needs, the interpreter's own prefix (``sys.prefix`` / ``sys.base_prefix``, so the numpy and
sympy of this environment import), fresh ``/proc``, ``/dev``, size-capped tmpfs ``/tmp`` and ``/dev/shm``,
and a per-call scratch folder (a host temp folder, deleted afterwards) as its read-write working directory
``/sandbox``. The root is read-only; ``/work``, ``/root`` and ``/home`` of the host are not mounted.

The code runs under the same interpreter as ``sys.executable``: a small launcher (``_BOOT``) sets the
rlimits, forks, runs the code in the child and reports how the child ended on a pipe. RLIMIT_NPROC does not
bind a process whose real uid is host root (the kernel exempts it, in any user namespace), so a root caller's
sandbox runs privileged bwrap without a user namespace and the launcher drops to a random unused uid before
anything else; a non-root caller's sandbox gets its own user namespace, which counts its processes apart.
"""
import asyncio
import concurrent.futures
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields
from typing import Dict, List, Optional, Tuple

INSTALL_HINT = "install bubblewrap: `bash scripts/install.sh` installs it, or `apt-get install bubblewrap`"
USERNS_HINT = ("allow user namespaces (sysctl user.max_user_namespaces=15000, kernel.unprivileged_userns_clone=1; "
               "on Ubuntu 24.04 kernel.apparmor_restrict_unprivileged_userns=0) or run as root")
MARKER = "msrl-sandbox"  # in every sandbox's command line and scratch folder name
SCRATCH = "/sandbox"
CODE = "/code/main.py"
ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": SCRATCH, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
       "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
KILL_GRACE_S = 30.0  # after the kill, how long to wait for the pipes to close
CHUNK = 65536
# uids a root caller's sandboxes run as (one at random per call, so RLIMIT_NPROC counts one sandbox only)
UID_RANGES = ((1 << 20, 1 << 21), (50000, 65534))

# argv[1] marker, [2] status fd, [3] uid to become (-1: keep), [4:8] cpu s, address-space bytes, processes, file bytes
_BOOT = r"""
import os, resource, sys
status, uid = int(sys.argv[2]), int(sys.argv[3])
for fd in os.listdir("/proc/self/fd"):
    if int(fd) > 2 and int(fd) != status:
        try:
            os.close(int(fd))
        except OSError:
            pass
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
pid = os.fork()
if pid == 0:
    os.close(status)
    cpu, mem, nproc, fsize = map(int, sys.argv[4:8])
    for res, soft, hard in ((resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, mem, mem),
                            (resource.RLIMIT_NPROC, nproc, nproc), (resource.RLIMIT_FSIZE, fsize, fsize),
                            (resource.RLIMIT_CORE, 0, 0)):
        top = resource.getrlimit(res)[1]
        if top != resource.RLIM_INFINITY:
            soft, hard = min(soft, top), min(hard, top)
        resource.setrlimit(res, (soft, hard))
    import types
    main = types.ModuleType("__main__")
    main.__file__ = sys.argv[0] = path = "%(code)s"
    del sys.argv[1:]
    sys.modules["__main__"] = main
    sys.path.insert(0, os.getcwd())
    with open(path, "rb") as f:
        source = f.read()
    try:
        exec(compile(source, path, "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as e:
        import traceback
        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        sys.exit(1)
    sys.exit(0)
_, st = os.waitpid(pid, 0)
end = "signal %%d" %% os.WTERMSIG(st) if os.WIFSIGNALED(st) else "exit %%d" %% os.WEXITSTATUS(st)
os.write(status, end.encode())
os._exit(0)
""" % {"code": CODE}


@dataclass(frozen=True)
class SandboxLimits:
    wall_seconds: float = 10.0      # whole run, killed (process group) after it
    cpu_seconds: int = 10           # RLIMIT_CPU
    memory_mb: int = 512            # RLIMIT_AS
    max_processes: int = 16         # processes/threads inside the sandbox
    output_bytes: int = 65536       # stdout+stderr kept (each truncated beyond, marked)
    file_bytes: int = 16 * 2**20    # RLIMIT_FSIZE: largest file written in scratch; also /tmp's size

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"SandboxLimits.{f.name} must be a positive number, got {value!r}")
            if f.type is int and not isinstance(value, int):
                raise ValueError(f"SandboxLimits.{f.name} must be a whole number, got {value!r}")


@dataclass(frozen=True)
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: Optional[int]  # the code's exit status; -N when signal N ended it; None on timeout
    status: str               # "ok", "error" (non-zero exit), "timeout" (wall limit), "killed" (a signal)
    output_truncated: bool
    wall_seconds: float


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here; the message is sandbox_problem()'s line."""


_PROBES: Dict[str, Tuple[Optional[str], bool]] = {}  # bwrap path -> (problem, knows --size)


def sandbox_problem() -> Optional[str]:
    """None when the sandbox runs here; else one line saying why and how to fix it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return f"sandbox: bubblewrap (bwrap) is not on PATH, so model-written code cannot run; {INSTALL_HINT}"
    return _probe(bwrap)[0]


def _probe(bwrap: str) -> Tuple[Optional[str], bool]:
    """Runs one sandbox with `print("ok")` the first time a bwrap is used; the answer is cached."""
    if bwrap not in _PROBES:
        try:
            helptext = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=60).stdout
            sized = "--size" in helptext
            with _Job("print('ok')", SandboxLimits(), bwrap, sized) as job:
                done = subprocess.run(job.argv, pass_fds=job.pass_fds, capture_output=True, text=True,
                                      timeout=60, start_new_session=True)
            if done.returncode == 0 and done.stdout == "ok\n":
                _PROBES[bwrap] = (None, sized)
            else:
                _PROBES[bwrap] = (_probe_failure(bwrap, done.stderr or done.stdout), sized)
        except (OSError, subprocess.SubprocessError) as e:
            return _probe_failure(bwrap, str(e)), False  # not cached: may be passing
    return _PROBES[bwrap]


def _probe_failure(bwrap: str, output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    said = lines[-1] if lines else "no output"
    if any(w in said.lower() for w in ("namespace", "uid map", "setting up uid", "operation not permitted")):
        return f"sandbox: {bwrap} cannot create its namespaces here ({said}); {USERNS_HINT}"
    return f"sandbox: the test run of {bwrap} failed ({said}); see docs/features/multi_turn.md (sandbox)"


def _interpreter_dirs() -> List[str]:
    """The interpreter's prefixes (a venv and its base), mounted read-only where /usr does not hold them."""
    real_exe = os.path.realpath(sys.executable)
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.dirname(real_exe))}
    out = []
    for d in sorted(os.path.realpath(d) for d in dirs):
        if d in ("/", "/usr") or d.startswith("/usr/") or any(d.startswith(o + "/") for o in out):
            continue
        out.append(d)
    return out


def _ancestors(path: str) -> List[str]:
    """'/a/b/c' -> ['/a', '/a/b']"""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


def _mapped(path: str, lo: int, hi: int) -> bool:
    try:
        with open(path) as f:
            rows = [tuple(map(int, line.split())) for line in f if line.strip()]
    except OSError:
        return False
    return any(inside <= lo and hi <= inside + count for inside, _, count in rows)


def _sandbox_uid() -> int:
    """A random uid no account uses, mapped in this user namespace (root callers only)."""
    for lo, hi in UID_RANGES:
        if _mapped("/proc/self/uid_map", lo, hi) and _mapped("/proc/self/gid_map", lo, hi):
            return random.randrange(lo, hi)
    return 65534


class _Job:
    """One sandbox run's host side: scratch folder, code file, status pipe and the bwrap command line."""

    def __init__(self, code: str, limits: SandboxLimits, bwrap: str, sized: bool):
        self.code, self.limits, self.bwrap, self.sized = code, limits, bwrap, sized

    def __enter__(self):
        self.scratch = tempfile.mkdtemp(prefix=MARKER + "-")
        try:
            root = os.geteuid() == 0
            uid = _sandbox_uid() if root else -1
            if root:
                os.chown(self.scratch, uid, uid)
            self.code_file = tempfile.TemporaryFile()
            self.code_file.write(self.code.encode("utf-8", "surrogateescape"))
            self.code_file.flush()
            self.code_file.seek(0)
            self.status_r, self.status_w = os.pipe()
        except BaseException:
            self.__exit__()
            raise
        self.pass_fds = (self.code_file.fileno(), self.status_w)
        self.argv = self._argv(root, uid)
        return self

    def spawned(self):
        """Closes the host's copies of what only the sandbox needs."""
        self.code_file.close()
        os.close(self.status_w)
        self.status_w = None

    def __exit__(self, *exc):
        if getattr(self, "code_file", None) is not None:
            self.code_file.close()
        for name in ("status_r", "status_w"):
            if getattr(self, name, None) is not None:
                try:
                    os.close(getattr(self, name))
                except OSError:
                    pass
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _argv(self, root: bool, uid: int) -> List[str]:
        lim = self.limits
        a = [self.bwrap, "--die-with-parent", "--new-session"]
        if root:  # privileged bwrap, no user namespace: the launcher drops to `uid` itself
            a += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                  "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        else:
            a += ["--unshare-all", "--unshare-user", "--disable-userns"]
        a += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
        for top in TOP_LINKS:
            if os.path.islink(top):
                a += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                a += ["--ro-bind", top, top]
        for path in ETC:
            a += ["--ro-bind-try", path, path]
        size = ["--size", str(lim.file_bytes)] if self.sized else []
        a += ["--proc", "/proc", "--dev", "/dev",
              "--perms", "1777", *size, "--tmpfs", "/tmp", "--perms", "1777", *size, "--tmpfs", "/dev/shm"]
        made, prefixes = {"/", "/tmp", "/proc", "/dev"}, _interpreter_dirs()
        for d in prefixes + [CODE]:
            for up in _ancestors(d):  # privileged bwrap would make them 0700, closed to the dropped uid
                if up not in made:
                    made.add(up)
                    a += ["--perms", "0755", "--dir", up]
        for d in prefixes:
            a += ["--ro-bind", d, d]
        a += ["--bind", self.scratch, SCRATCH, "--perms", "0444", "--ro-bind-data", str(self.pass_fds[0]), CODE,
              "--remount-ro", "/", "--chdir", SCRATCH, "--clearenv"]
        for key, value in ENV.items():
            a += ["--setenv", key, value]
        a += [sys.executable, "-I", "-u", "-c", _BOOT, os.path.basename(self.scratch),
              str(self.status_w), str(uid), str(lim.cpu_seconds), str(lim.memory_mb * 2**20),
              str(lim.max_processes), str(lim.file_bytes)]
        return a


class _Sink:
    """Keeps the first `keep` bytes of a stream and counts (drops) the rest."""

    def __init__(self, keep: int):
        self.keep, self.data, self.total = keep, bytearray(), 0

    async def drain(self, stream: asyncio.StreamReader):
        while True:
            chunk = await stream.read(CHUNK)
            if not chunk:
                return
            self.total += len(chunk)
            room = self.keep - len(self.data)
            if room > 0:
                self.data += chunk[:room]

    def text(self) -> str:
        text = self.data.decode("utf-8", "replace")
        if self.total > self.keep:
            text += f"\n[output truncated: {self.total} bytes written, the first {self.keep} kept]"
        return text


async def _feed(stdin: asyncio.StreamWriter, data: bytes):
    try:
        if data:
            stdin.write(data)
            await stdin.drain()
        stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _ending(timed_out: bool, status: str, returncode: Optional[int]) -> Tuple[str, Optional[int]]:
    """(status, exit_code) from the launcher's report ("exit N" / "signal N") or, without one, bwrap's code."""
    if timed_out:
        return "timeout", None
    word, _, number = status.partition(" ")
    if word == "signal" and number.isdigit():
        return "killed", -int(number)
    if word == "exit" and number.isdigit():
        return ("ok" if number == "0" else "error"), int(number)
    if returncode is None or returncode < 0 or returncode > 128:
        return "killed", returncode
    return "error", returncode


async def run_python_async(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> SandboxResult:
    """Runs `code` in a fresh sandbox; many may run at once on one event loop."""
    problem = sandbox_problem()
    if problem is not None:
        raise SandboxUnavailable(problem)
    bwrap = shutil.which("bwrap")
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    with _Job(code, limits, bwrap, _probe(bwrap)[1]) as job:
        try:
            proc = await asyncio.create_subprocess_exec(
                *job.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, pass_fds=job.pass_fds, start_new_session=True)
        finally:
            job.spawned()
        status_reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(status_reader),
                                                    os.fdopen(job.status_r, "rb", buffering=0))
        job.status_r = None  # the transport owns it now
        out, err, status = _Sink(limits.output_bytes), _Sink(limits.output_bytes), _Sink(64)
        tasks = [asyncio.ensure_future(c) for c in (
            out.drain(proc.stdout), err.drain(proc.stderr), status.drain(status_reader), proc.wait(),
            _feed(proc.stdin, stdin.encode("utf-8", "surrogateescape")))]
        try:
            _, pending = await asyncio.wait(tasks, timeout=limits.wall_seconds)
            timed_out = bool(pending)
            if pending:
                _kill(proc)
                _, pending = await asyncio.wait(pending, timeout=KILL_GRACE_S)
        finally:
            if proc.returncode is None:
                _kill(proc)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            transport.close()
            proc_transport = getattr(proc, "_transport", None)  # pipes still held open: close them here
            if proc_transport is not None:
                proc_transport.close()
        state, exit_code = _ending(timed_out, bytes(status.data).decode("ascii", "replace"), proc.returncode)
    return SandboxResult(stdout=out.text(), stderr=err.text(), exit_code=exit_code, status=state,
                         output_truncated=out.total > out.keep or err.total > err.keep,
                         wall_seconds=time.monotonic() - start)


def run_python(code: str, limits: SandboxLimits = SandboxLimits(), stdin: str = "") -> SandboxResult:
    """run_python_async from plain code (on a helper thread when this thread already runs an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run_python_async(code, limits, stdin))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run_python_async(code, limits, stdin)).result()
