"""The code sandbox: what model-written code may and may not do, and how each run ends.

Without a working sandbox these tests fail (with sandbox_problem()'s line), unless MSRL_ALLOW_NO_SANDBOX=1."""
import asyncio
import glob
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

from mindspeed_rl.tools import sandbox as sb
from mindspeed_rl.tools.sandbox import (SandboxLimits, SandboxUnavailable, run_python, run_python_async,
                                        sandbox_problem)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
ALLOW = "MSRL_ALLOW_NO_SANDBOX"


@pytest.fixture
def box():
    problem = sandbox_problem()
    if problem is not None:
        if os.environ.get(ALLOW) == "1":
            pytest.skip(problem)
        pytest.fail(f"{problem} (set {ALLOW}=1 to skip the sandbox tests)")


def _run(code, **limits):
    return run_python(textwrap.dedent(code), SandboxLimits(**limits))


def _pythonpath():
    return os.pathsep.join([ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def _sandbox_pids():
    """Host processes of any sandbox (the marker is in bwrap's and the launcher's command lines)."""
    pids = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if (sb.MARKER + "-").encode() in f.read():
                        pids.append(int(p))
            except OSError:
                pass
    return pids


def _left_over(wait_s=20.0):
    """Sandbox processes still there after up to wait_s (they go as the kernel reaps them); kills them."""
    end = time.monotonic() + wait_s
    while _sandbox_pids() and time.monotonic() < end:
        time.sleep(0.1)
    left = _sandbox_pids()
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    return left


def test_prints_reads_stdin_and_exit_codes(box):
    r = run_python("import sys\nprint('hi', sys.stdin.read().upper())", stdin="abc")
    assert (r.status, r.exit_code, r.stdout, r.stderr, r.output_truncated) == ("ok", 0, "hi ABC\n", "", False)
    assert r.wall_seconds > 0
    r = run_python("import sys\nprint('partial')\nsys.exit(3)")
    assert (r.status, r.exit_code, r.stdout) == ("error", 3, "partial\n")


def test_exception_shows_the_codes_traceback_only(box):
    r = _run("""\
        x = 1
        x / 0
        """)
    assert (r.status, r.exit_code) == ("error", 1)
    assert 'File "/code/main.py", line 2, in <module>' in r.stderr and "ZeroDivisionError" in r.stderr
    assert "<string>" not in r.stderr  # the launcher's frame is left out
    r = run_python("def f(:\n")
    assert r.status == "error" and "SyntaxError" in r.stderr and "main.py" in r.stderr


def test_environment_numpy_imports_and_host_env_stays_out(box, monkeypatch):
    pytest.importorskip("numpy")
    monkeypatch.setenv("MSRL_SECRET_PROBE", "s3cret")
    r = _run("""\
        import os, numpy
        print(numpy.arange(4).sum(), os.environ.get("MSRL_SECRET_PROBE"), os.getcwd())
        """)
    assert (r.status, r.stdout) == ("ok", f"6 None {sb.SCRATCH}\n"), r.stderr


def test_no_privileges_and_no_host_descriptors(box):
    r = _run("""\
        import os
        status = dict(l.split(":\\t") for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
        print(os.getuid(), os.getgid(), os.getgroups(), sorted(os.listdir("/proc/self/fd")))
        print(status["CapPrm"], status["CapEff"], status["CapAmb"], status["NoNewPrivs"])
        """)
    ids, caps = r.stdout.splitlines()
    uid, gid, groups, fds = ids.split(" ", 3)
    assert caps.split() == ["0000000000000000"] * 3 + ["1"]
    assert fds == "['0', '1', '2', '3']"  # 3: listdir's own
    if os.geteuid() == 0:  # RLIMIT_NPROC does not bind uid 0: the sandbox must run as another uid
        assert int(uid) != 0 and int(gid) != 0 and groups == "[]"


def test_no_network_inside_while_the_same_code_connects_outside(box):
    tcp = socket.socket()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(8)
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(2)
        code = textwrap.dedent(f"""\
            import socket
            try:
                socket.create_connection(("127.0.0.1", {tcp.getsockname()[1]}), timeout=5).close()
                print("tcp connected")
            except OSError as e:
                print("tcp failed", type(e).__name__)
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.sendto(b"ping", ("127.0.0.1", {udp.getsockname()[1]}))
            print("interfaces", sorted(n for _, n in socket.if_nameindex()))
            """)
        outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert outside.stdout.startswith("tcp connected\n")
        assert udp.recvfrom(16)[0] == b"ping"
        inside = run_python(code + textwrap.dedent("""\
            try:
                socket.getaddrinfo("example.com", 80)
                print("dns resolved")
            except OSError as e:
                print("dns failed")
            """))
        assert inside.stdout == "tcp failed ConnectionRefusedError\ninterfaces ['lo']\ndns failed\n", inside.stderr
        with pytest.raises(socket.timeout):
            udp.recvfrom(16)
    finally:
        tcp.close()
        udp.close()


def test_writes_land_in_scratch_only(box):
    token = uuid.uuid4().hex
    targets = {"host_tmp": os.path.join(tempfile.gettempdir(), f"escape-{token}"),
               "repo": os.path.join(ROOT, f"escape-{token}"),
               "home": os.path.join(os.path.expanduser("~"), f"escape-{token}"),
               "root": f"/escape-{token}", "interpreter": os.path.join(sys.prefix, f"escape-{token}")}
    try:
        r = _run(f"""\
            import os
            for name, path in {targets!r}.items():
                try:
                    with open(path, "w") as f:
                        f.write("x")
                    print(name, "written")
                except OSError as e:
                    print(name, "refused")
            with open("scratch.txt", "w") as f:
                f.write("kept")
            print("scratch", open("scratch.txt").read(), os.path.abspath("scratch.txt"))
            print("visible", os.path.exists({ROOT!r}), os.path.exists("/work"), os.path.exists("/home"))
            print("top", sorted(os.listdir("/")))
            """)
        lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        for name in ("repo", "home", "root", "interpreter"):
            assert lines[name] == "refused", (name, r.stdout, r.stderr)
        assert lines["scratch"] == f"kept {sb.SCRATCH}/scratch.txt"
        # the interpreter's own prefix is mounted read-only: its top folder shows (a venv under /work, say)
        tops = {d.strip("/").split("/")[0] for d in sb._interpreter_dirs()}
        assert lines["visible"] == f"False {'work' in tops} False"
        assert set(eval(lines["top"])) <= {"bin", "code", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc",
                                           "root", "sandbox", "sbin", "tmp", "usr", "opt"} | tops
        assert not [p for p in targets.values() if os.path.exists(p)]  # the sandbox's /tmp is its own
    finally:
        for path in targets.values():
            if os.path.exists(path):
                os.remove(path)


def test_scratch_folder_is_removed_after_each_call(box):
    token = uuid.uuid4().hex
    for limits in ({}, {"wall_seconds": 1.0}):
        r = _run(f"open('{token}', 'w').write('x')\nimport time\ntime.sleep(3 if {bool(limits)} else 0)", **limits)
        assert r.status == ("timeout" if limits else "ok")
        assert glob.glob(os.path.join(tempfile.gettempdir(), f"{sb.MARKER}-*", token)) == []


def _children_allowed(max_processes):
    """How many sleeping children a sandbox forked before a fork was refused (None: all 40 went through)."""
    r = _run("""\
        import os, time
        kids = 0
        for _ in range(40):
            try:
                pid = os.fork()
            except BlockingIOError:
                print("refused after", kids)
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            kids += 1
        else:
            print("forked", kids)
        """, max_processes=max_processes, wall_seconds=60)
    assert _left_over() == []  # the sleeping children went with the sandbox
    assert r.status == "ok", r.stderr
    word, _, count = r.stdout.strip().rpartition(" ")
    return int(count) if word == "refused after" else None


def test_process_limit_bites(box):
    # the launcher and the code itself count too (and, without a user namespace of its own, bwrap's init)
    assert 10 <= (_children_allowed(16) or 99) <= 14


def test_fork_bomb_is_contained_and_nothing_remains(box):
    # never set off a bomb the process limit would not hold (a broken limit fails the test above)
    assert _children_allowed(16) is not None, "the process limit does not bite: the fork bomb is not run"
    before = len([p for p in os.listdir("/proc") if p.isdigit()])
    r = _run("import os\nwhile True:\n    os.fork()\n", max_processes=16, wall_seconds=20)
    assert r.status in ("error", "killed", "timeout")
    assert _left_over() == []
    after = len([p for p in os.listdir("/proc") if p.isdigit()])
    assert after < before + 50  # the machine's process count is back (others' processes come and go)


def test_orphans_die_with_the_sandbox(box):
    r = _run("""\
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)
            os._exit(0)
        print("parent done")
        """)
    left = _left_over()
    assert (r.status, r.stdout, left) == ("ok", "parent done\n", [])


def test_memory_bomb_is_refused(box):
    # bytes(n) maps zero pages lazily: without the limit this reaches 4 GiB of address space, not of memory
    r = _run("""\
        blocks = []
        while len(blocks) < 64:
            blocks.append(bytes(64 * 2**20))
        print("allocated", len(blocks))
        """, memory_mb=256)
    assert "allocated" not in r.stdout
    assert r.status == "killed" or (r.status == "error" and "MemoryError" in r.stderr), r


def test_cpu_loop_is_killed_by_the_cpu_limit(box):
    r = _run("while True:\n    pass\n", cpu_seconds=1, wall_seconds=60)
    assert r.status == "killed" and r.exit_code in (-24, -9), r  # SIGXCPU, then SIGKILL at the hard limit


def test_sleep_forever_ends_at_the_wall_limit_with_its_children(box):
    r = _run("""\
        import os, time
        print("started")
        if os.fork() == 0:
            time.sleep(600)
        time.sleep(600)
        """, wall_seconds=1.0)
    left = _left_over()
    assert (r.status, r.exit_code, r.stdout, left) == ("timeout", None, "started\n", [])


def test_megabytes_of_output_are_cut_with_a_marker(box):
    r = _run("""\
        import sys
        sys.stdout.write("o" * 3_000_000)
        sys.stderr.write("e" * 2_000_000)
        """, output_bytes=1000)
    assert (r.status, r.output_truncated) == ("ok", True)
    assert r.stdout == "o" * 1000 + "\n[output truncated: 3000000 bytes written, the first 1000 kept]"
    assert r.stderr == "e" * 1000 + "\n[output truncated: 2000000 bytes written, the first 1000 kept]"
    r = _run("print('o' * 999)", output_bytes=1000)
    assert (r.stdout, r.output_truncated) == ("o" * 999 + "\n", False)


def test_host_memory_stays_bounded_while_draining_output(box):
    # a fresh interpreter; its peak is VmHWM, the high-water mark of its own memory map (ru_maxrss would keep the
    # forking parent's peak across exec: under a large pytest process it reads hundreds of MB)
    probe = textwrap.dedent("""\
        from mindspeed_rl.tools.sandbox import SandboxLimits, run_python
        r = run_python("import sys\\nfor _ in range(256):\\n    sys.stdout.write('x' * 2**20)",
                       SandboxLimits(output_bytes=1000, wall_seconds=600))  # a bound only: a busy machine
        hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
        print(r.status, r.output_truncated, int(hwm) // 1024)
        """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": _pythonpath()})
    status, truncated, peak_mb = done.stdout.split()
    assert (status, truncated) == ("ok", "True"), (done.stdout, done.stderr[-2000:])
    assert int(peak_mb) < 128, done.stdout  # 256 MiB went through


def test_many_concurrent_calls_complete(box):
    async def many():
        return await asyncio.gather(*(run_python_async(
            f"import sys, time\ntime.sleep(0.2)\nprint({i}, sys.stdin.read())", stdin=f"in{i}") for i in range(8)))

    results = asyncio.run(many())
    assert [(r.status, r.stdout) for r in results] == [("ok", f"{i} in{i}\n") for i in range(8)]


def test_run_python_works_inside_a_running_event_loop(box):
    async def caller():
        return run_python("print(6 * 7)")

    assert asyncio.run(caller()).stdout == "42\n"


def test_limits_refuse_bad_values():
    with pytest.raises(ValueError, match=r"^SandboxLimits\.memory_mb must be a positive number, got 0$"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(ValueError, match=r"^SandboxLimits\.cpu_seconds must be a whole number, got 1\.5$"):
        SandboxLimits(cpu_seconds=1.5)
    assert SandboxLimits(wall_seconds=2).wall_seconds == 2


def test_sandbox_problem_is_none_here(box):
    assert sandbox_problem() is None


def test_missing_bwrap_gives_one_line_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    problem = sandbox_problem()
    assert problem == ("sandbox: bubblewrap (bwrap) is not on PATH, so model-written code cannot run; install "
                       "bubblewrap: `bash scripts/install.sh` installs it, or `apt-get install bubblewrap`")
    with pytest.raises(SandboxUnavailable) as err:
        run_python("print(1)")
    assert str(err.value) == problem


def test_bwrap_without_user_namespaces_is_named_and_probed_once(monkeypatch, tmp_path):
    calls = tmp_path / "calls"
    fake = tmp_path / "bwrap"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$1" >> {calls}
        [ "$1" = --help ] && {{ echo "    --size BYTES"; exit 0; }}
        echo "bwrap: No permissions to creating new namespace, likely because the kernel does not allow \
non-privileged user namespaces." >&2
        exit 1
        """))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    for _ in range(2):
        problem = sandbox_problem()
        assert problem.startswith(f"sandbox: {fake} cannot create its namespaces here (bwrap: No permissions to "
                                  "creating new namespace")
        assert "allow user namespaces" in problem and "\n" not in problem
    assert calls.read_text().split() == ["--help", "--die-with-parent"]  # cached after the first probe


def test_another_bwrap_failure_quotes_bwrap_and_points_to_the_docs(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --help ] && exit 0\n"
                    "echo 'bwrap: Can'\\''t find source path /usr: No such file or directory' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sandbox_problem() == (f"sandbox: the test run of {fake} failed (bwrap: Can't find source path /usr: No such "
                                 "file or directory); see docs/features/multi_turn.md (sandbox)")


def test_a_missing_sandbox_fails_the_tests_unless_allowed(tmp_path):
    node = "tests/ut/tools/test_sandbox.py::test_prints_reads_stdin_and_exit_codes"
    outcomes = []
    for allow in ("0", "1"):
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                               "no:hypothesispytest", "--noconftest", node], cwd=ROOT,
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PATH": str(tmp_path), ALLOW: allow, "PYTHONPATH": _pythonpath()})
        outcomes.append((done.returncode, done.stdout.strip().splitlines()[-1].split(" in ")[0]))
    assert outcomes == [(1, "1 error"), (0, "1 skipped")]  # error: the fixture fails
