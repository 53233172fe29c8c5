"""The sandbox's parts that need no bubblewrap: the limits' checks, how the launcher's report becomes a status,
the probe's failure lines, and the output sink (what it keeps, how it decodes); and, in the real sandbox, the
default stdin and a call from inside a running event loop."""
import asyncio
import gc
import os
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from mindspeed_rl.tools import sandbox as sb
from mindspeed_rl.tools.sandbox import SandboxLimits, run_python
from tests.ut.tools.test_sandbox import _sandbox_pids, box  # noqa: F401  (fixture)


@pytest.mark.parametrize("kw, message", [
    ({"wall_seconds": True}, "SandboxLimits.wall_seconds must be a positive number, got True"),
    ({"wall_seconds": "5"}, "SandboxLimits.wall_seconds must be a positive number, got '5'"),
    ({"memory_mb": 0}, "SandboxLimits.memory_mb must be a positive number, got 0"),
    ({"cpu_seconds": 1.5}, "SandboxLimits.cpu_seconds must be a whole number, got 1.5"),
])
def test_limits_are_checked_by_field(kw, message):
    with pytest.raises(ValueError) as err:
        SandboxLimits(**kw)
    assert str(err.value) == message
    assert SandboxLimits(wall_seconds=0.5).wall_seconds == 0.5  # a float field takes a fraction


@pytest.mark.parametrize("timed_out, status, code, want", [
    (True, "exit 0", 0, ("timeout", None)),
    (False, "exit 0", 0, ("ok", 0)),
    (False, "exit 3", 3, ("error", 3)),
    (False, "signal 9", None, ("killed", -9)),
    (False, "word 7", 1, ("error", 1)),      # no report the launcher writes: bwrap's own code
    (False, "", 137, ("killed", 137)),
    (False, "", -9, ("killed", -9)),
    (False, "", None, ("killed", None)),
    (False, "", 2, ("error", 2)),
    (False, "", 0, ("error", 0)),            # bwrap ended well but the launcher said nothing
    (False, "", 128, ("error", 128)),
    (False, "", 129, ("killed", 129)),       # 128 + N: a signal
])
def test_the_launchers_report_becomes_the_status(timed_out, status, code, want):
    assert sb._ending(timed_out, status, code) == want


@pytest.mark.parametrize("said", ["bwrap: No permissions to create new namespace", "bwrap: write to uid map failed",
                                  "bwrap: Setting up UID failed", "bwrap: Operation not permitted"])  # one word each
def test_a_probe_stopped_by_namespaces_names_the_fix(said):
    assert sb._probe_failure("/usr/bin/bwrap", f"first line\n{said}\n\n") == (
        f"sandbox: /usr/bin/bwrap cannot create its namespaces here ({said}); {sb.USERNS_HINT}")


def test_other_probe_failures_say_what_was_printed():
    assert sb._probe_failure("bw", "") == ("sandbox: the test run of bw failed (no output); see "
                                           "docs/features/multi_turn.md (sandbox)")
    assert sb._probe_failure("bw", "  \nboom\n") == ("sandbox: the test run of bw failed (boom); see "
                                                     "docs/features/multi_turn.md (sandbox)")


def _drain(keep, *chunks):
    async def go():
        reader = asyncio.StreamReader()
        for c in chunks:
            reader.feed_data(c)
        reader.feed_eof()
        sink = sb._Sink(keep)
        await sink.drain(reader)
        return sink
    return asyncio.run(go())


def test_the_sink_keeps_its_first_bytes_and_counts_the_rest(monkeypatch):
    monkeypatch.setattr(sb, "CHUNK", 2)  # reads of 2 bytes: the room left is filled exactly
    sink = _drain(3, b"abcde")
    assert (bytes(sink.data), sink.total) == (b"abc", 5)
    assert sink.text() == "abc\n[output truncated: 5 bytes written, the first 3 kept]"
    whole = _drain(5, b"ab", b"cde")
    assert whole.text() == "abcde"


def test_the_sink_decodes_broken_utf8_with_replacement_marks():
    assert _drain(10, b"ok \xff\xfe!").text() == "ok \ufffd\ufffd!"


def test_run_python_reads_empty_stdin_by_default_and_works_inside_a_running_loop(box):
    assert run_python("import sys; print(repr(sys.stdin.read()))").stdout == "''\n"

    async def inside():  # the caller's thread runs an event loop: the sandbox runs on a helper thread
        return run_python("import sys; print(sys.stdin.read()[::-1])", stdin="abc")
    assert asyncio.run(inside()).stdout == "cba\n"


def test_run_python_async_reads_empty_stdin_by_default_and_passes_undecodable_bytes(box):
    read = "import sys; print(sys.stdin.buffer.read())"
    assert asyncio.run(sb.run_python_async(read)).stdout == "b''\n"
    # stdin given as text with surrogate escapes (bytes that were not UTF-8) reaches the code as those bytes
    assert run_python(read, stdin="a\udcff").stdout == "b'a\\xff'\n"


def test_tmp_holds_no_more_than_file_bytes_in_all(box):
    # each file fits RLIMIT_FSIZE; together they pass the size of the sandbox's /tmp (a tmpfs of file_bytes)
    r = run_python(textwrap.dedent("""\
        written = 0
        try:
            for i in range(4):
                with open(f"/tmp/f{i}", "wb") as f:
                    f.write(b"x" * 300_000)
                written += 1
        except OSError as e:
            print("stopped", type(e).__name__, written)
        else:
            print("wrote", written)
        """), SandboxLimits(file_bytes=500_000))
    assert r.stdout.startswith("stopped OSError 1"), (r.stdout, r.stderr)


def test_ancestors_of_a_path():
    assert sb._ancestors("/a/b/c") == ["/a", "/a/b"] == sb._ancestors("/a/b/c/")
    assert sb._ancestors("/a") == []


def test_interpreter_dirs_skip_the_system_and_nested_prefixes(monkeypatch):
    fake = SimpleNamespace(prefix="/opt/venv", base_prefix="/usr", exec_prefix="/opt/venv/lib/x",
                           base_exec_prefix="/", executable="/srv/py/bin/python3")
    monkeypatch.setattr(sb, "sys", fake)
    assert sb._interpreter_dirs() == ["/opt/venv", "/srv/py"]
    fake.base_prefix, fake.base_exec_prefix = "/usr/local", "/usr/lib/py"
    assert sb._interpreter_dirs() == ["/opt/venv", "/srv/py"]


def test_a_uid_range_is_used_only_when_both_maps_hold_it(tmp_path, monkeypatch):
    maps = tmp_path / "map"
    maps.write_text("0 0 100\n1000 5000 200\n\n")
    assert sb._mapped(str(maps), 1000, 1200) and sb._mapped(str(maps), 0, 100)
    assert not sb._mapped(str(maps), 999, 1100) and not sb._mapped(str(maps), 1000, 1201)
    assert not sb._mapped(str(tmp_path / "none"), 0, 1)
    asked = []
    answers = {"/proc/self/uid_map": True, "/proc/self/gid_map": False}
    monkeypatch.setattr(sb, "_mapped", lambda path, lo, hi: asked.append(path) or answers[path])
    assert sb._sandbox_uid() == 65534  # the gid map lacks every range: nobody
    assert asked[:2] == ["/proc/self/uid_map", "/proc/self/gid_map"]
    answers["/proc/self/gid_map"] = True
    lo, hi = sb.UID_RANGES[0]
    assert lo <= sb._sandbox_uid() < hi


def test_stderr_alone_can_be_cut_and_exactly_full_is_not_cut(box):
    r = run_python("import sys; sys.stderr.write('e' * 50)", SandboxLimits(output_bytes=10))
    assert r.output_truncated and r.stdout == "" and r.stderr.startswith("e" * 10 + "\n[output truncated")
    r = run_python("import sys; sys.stderr.write('e' * 10)", SandboxLimits(output_bytes=10))
    assert not r.output_truncated and r.stderr == "e" * 10
    assert 0.0 <= r.wall_seconds < 300.0


def _my_sandboxes():
    me = os.getpid()
    mine = []
    for pid in _sandbox_pids():
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                    mine.append(pid)
        except (OSError, ValueError, IndexError):
            pass
    return mine


def test_a_cancelled_run_kills_its_sandbox_and_closes_its_pipes(box, monkeypatch):
    gc.collect()  # earlier tests' garbage closes its descriptors now, not in the middle of the count
    fds = len(os.listdir("/proc/self/fd"))
    unraisable = []  # a transport left open fails in its __del__ once the loop is gone
    monkeypatch.setattr(sys, "unraisablehook", lambda info: unraisable.append(info.exc_value))

    async def go():
        task = asyncio.ensure_future(sb.run_python_async("import time; time.sleep(600)",
                                                         SandboxLimits(wall_seconds=300)))
        for _ in range(1200):  # until the sandbox runs (at most a minute)
            if _my_sandboxes():
                break
            await asyncio.sleep(0.05)
        assert _my_sandboxes(), "the sandbox never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    asyncio.run(go())
    for _ in range(600):  # its processes end (bounded: a minute)
        if not _my_sandboxes():
            break
        time.sleep(0.1)
    assert _my_sandboxes() == []
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds  # a pipe left open would add descriptors
    assert unraisable == []


def test_a_job_marks_its_scratch_and_keeps_the_codes_bytes():
    with sb._Job("# caf\udce9", SandboxLimits(), "/usr/bin/bwrap", True) as job:
        assert os.path.basename(job.scratch).startswith(sb.MARKER + "-")
        assert any(sb.MARKER + "-" in a for a in job.argv)  # how _sandbox_pids finds its processes
        assert job.code_file.read() == b"# caf\xe9"  # surrogate escapes back to the bytes they stood for
        scratch = job.scratch
    assert not os.path.exists(scratch)


def _policy(monkeypatch, tmp_path, root, sized):
    """The bwrap command line of a job, on a stand-in host: one top-level link and one folder, one /etc file, one
    interpreter prefix."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "bin").symlink_to("usr/bin")
    monkeypatch.setattr(sb, "TOP_LINKS", (str(tmp_path / "bin"), str(tmp_path / "lib"), str(tmp_path / "none")))
    monkeypatch.setattr(sb, "ETC", ("/etc/ld.so.cache",))
    monkeypatch.setattr(sb, "ENV", {"HOME": "/sandbox", "LANG": "C.UTF-8"})
    monkeypatch.setattr(sb, "_interpreter_dirs", lambda: ["/opt/py/3.11"])
    limits = SandboxLimits(cpu_seconds=7, memory_mb=3, max_processes=5, file_bytes=1000)
    job = sb._Job("x = 1", limits, "/usr/bin/bwrap", sized)
    job.__enter__()
    try:
        return job, job._argv(root, 4321 if root else -1)
    finally:
        job.__exit__()


def _tail(job, tmp_path, uid, size):
    return (["--hostname", "sandbox", "--ro-bind", "/usr", "/usr",
             "--symlink", "usr/bin", str(tmp_path / "bin"), "--ro-bind", str(tmp_path / "lib"), str(tmp_path / "lib"),
             "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
             "--proc", "/proc", "--dev", "/dev", "--perms", "1777", *size, "--tmpfs", "/tmp",
             "--perms", "1777", *size, "--tmpfs", "/dev/shm",
             "--perms", "0755", "--dir", "/opt", "--perms", "0755", "--dir", "/opt/py",
             "--perms", "0755", "--dir", "/code", "--ro-bind", "/opt/py/3.11", "/opt/py/3.11",
             "--bind", job.scratch, "/sandbox", "--perms", "0444", "--ro-bind-data", str(job.pass_fds[0]),
             "/code/main.py", "--remount-ro", "/", "--chdir", "/sandbox", "--clearenv",
             "--setenv", "HOME", "/sandbox", "--setenv", "LANG", "C.UTF-8",
             sys.executable, "-I", "-u", "-c", sb._BOOT, os.path.basename(job.scratch), str(job.status_w), uid,
             "7", str(3 * 2**20), "5", "1000"])


def test_the_command_line_of_a_privileged_sandbox(monkeypatch, tmp_path):
    job, argv = _policy(monkeypatch, tmp_path, root=True, sized=True)
    assert argv == ["/usr/bin/bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
                    "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--cap-add", "CAP_SETUID",
                    "--cap-add", "CAP_SETGID"] + _tail(job, tmp_path, "4321", ["--size", "1000"])


def test_the_command_line_of_an_unprivileged_sandbox(monkeypatch, tmp_path):
    job, argv = _policy(monkeypatch, tmp_path, root=False, sized=False)
    assert argv == ["/usr/bin/bwrap", "--die-with-parent", "--new-session", "--unshare-all", "--unshare-user",
                    "--disable-userns"] + _tail(job, tmp_path, "-1", [])


def test_a_job_closes_what_it_opened(tmp_path):
    job = sb._Job("x = 1", SandboxLimits(), "/usr/bin/bwrap", True)
    job.__enter__()
    code, r, w = job.code_file, job.status_r, job.status_w
    job.__exit__()
    assert code.closed and not os.path.exists(job.scratch)
    for fd in (r, w):
        with pytest.raises(OSError):
            os.fstat(fd)
    job.__exit__()  # twice: nothing left to close, no error


def test_a_launcher_that_never_reports_ends_with_bwraps_code(box, monkeypatch):
    # the probe passed (box); then bwrap cannot start the interpreter: no report, bwrap's own exit code 1
    real = sb.sys
    monkeypatch.setattr(sb, "sys", SimpleNamespace(prefix=real.prefix, base_prefix=real.base_prefix,
                                                   exec_prefix=real.exec_prefix,
                                                   base_exec_prefix=real.base_exec_prefix,
                                                   executable="/nonexistent/python3"))
    r = run_python("print(1)")
    assert (r.status, r.exit_code, r.stdout) == ("error", 1, "")
    assert "execvp /nonexistent/python3" in r.stderr


def test_an_unprivileged_job_runs_in_a_user_namespace_as_itself(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sb, "_sandbox_uid", lambda: pytest.fail("no uid is picked for a caller that is not root"))
    with sb._Job("x = 1", SandboxLimits(), "/usr/bin/bwrap", True) as job:
        assert "--unshare-user" in job.argv and "--cap-add" not in job.argv
        assert job.argv[-5] == "-1"  # the launcher keeps its uid (the namespace's own)


def test_a_job_that_cannot_open_its_code_file_raises_that_error(monkeypatch):
    def no_space():
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(sb.tempfile, "TemporaryFile", no_space)
    with pytest.raises(OSError, match="No space left on device"):
        with sb._Job("x = 1", SandboxLimits(), "/usr/bin/bwrap", True):
            pass


def test_ancestors_strip_only_slashes():
    assert sb._ancestors("/Xa/bX/c") == ["/Xa", "/Xa/bX"]


def test_prefixes_that_share_a_folder_make_it_once(monkeypatch, tmp_path):
    monkeypatch.setattr(sb, "_interpreter_dirs", lambda: ["/opt/a", "/opt/b"])
    with sb._Job("x = 1", SandboxLimits(), "/usr/bin/bwrap", True) as job:
        dirs = [job.argv[i + 1] for i, a in enumerate(job.argv) if a == "--dir"]
    assert dirs == ["/opt", "/code"]


def test_a_probe_that_cannot_run_bwrap_says_why_and_is_not_cached(monkeypatch):
    monkeypatch.setattr(sb, "_PROBES", {})

    def broken(*args, **kwargs):
        raise OSError("exec format error")
    monkeypatch.setattr(sb.subprocess, "run", broken)
    assert sb._probe("/x/bwrap") == ("sandbox: the test run of /x/bwrap failed (exec format error); see "
                                     "docs/features/multi_turn.md (sandbox)", False)
    assert sb._PROBES == {}  # asked again next time: it may pass then
