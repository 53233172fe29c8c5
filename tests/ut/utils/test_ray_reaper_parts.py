"""ray_reaper's parts in this process: how it reads /proc, which processes it counts as the session's, how it
waits for the driver without pidfd, and its main run against sleeping processes started here."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from mindspeed_rl.utils import ray_reaper

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SLEEP = "import time; time.sleep(300)"


@pytest.fixture
def ray_dir(tmp_path):
    """A stand-in for Ray's package folder holding one program: a sleeper."""
    folder = tmp_path / "ray"
    folder.mkdir()
    (folder / "sleeper.py").write_text(f"{SLEEP}\n")
    return folder


@pytest.fixture
def procs():
    """Processes a test starts; each is killed and waited for at the end."""
    started = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=60)


def _started(proc, pid=None):
    """``proc`` once its exec has set its arguments in /proc (bounded: Popen returns a moment before)."""
    for _ in range(6000):
        with open(f"/proc/{pid or proc.pid}/cmdline", "rb") as f:
            if f.read():
                return proc
        time.sleep(0.01)
    raise AssertionError(f"process {pid or proc.pid} shows no arguments")


def _ray_program(procs, ray_dir, *args, **kwargs):
    """A program of the Ray package folder, sleeping."""
    proc = subprocess.Popen([sys.executable, str(ray_dir / "sleeper.py"), *args], **kwargs)
    procs.append(proc)
    return _started(proc)


def _ended(pid) -> bool:
    """Whether ``pid`` is gone or a zombie, waited for (bounded) since a SIGKILL lands at once."""
    for _ in range(6000):
        st = ray_reaper._stat(str(pid))
        if st is None or st[0] in "ZX":
            return True
        time.sleep(0.01)
    return False


def test_stat_reads_state_and_parent_past_a_name_with_parentheses(procs):
    code = ("import ctypes, time; ctypes.CDLL(None).prctl(15, b'x) 1 2 (y', 0, 0, 0); print(flush=True); "
            "time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    procs.append(proc)
    proc.stdout.readline()  # named
    with open(f"/proc/{proc.pid}/comm") as f:
        assert f.read().strip() == "x) 1 2 (y"
    state, parent = ray_reaper._stat(str(proc.pid))
    assert state in "RSD" and parent == os.getpid()  # running or asleep, a child of this process
    proc.kill()
    proc.wait(timeout=60)
    assert ray_reaper._stat(str(proc.pid)) is None


def test_family_takes_every_generation():
    parents = {2: 1, 3: 2, 4: 3, 5: 4, 6: 1, 7: 9, 8: 7}
    assert ray_reaper._family(1, parents) == {1, 2, 3, 4, 5, 6}
    assert ray_reaper._family(7, parents) == {7, 8}
    assert ray_reaper._family(5, parents) == {5}


def test_ray_package_is_matched_as_a_whole_folder_in_the_first_three_arguments():
    ray = "/opt/env/ray"
    assert ray_reaper.is_ray_process(["python", "-u", "/opt/env/ray/dashboard/agent.py"], ray)
    assert ray_reaper.is_ray_process(["/opt/env/ray/core/src/ray/gcs/gcs_server", "--x=1"], ray + "/")
    assert ray_reaper.is_ray_process(["ray::IDLE"], ray)
    assert not ray_reaper.is_ray_process([], ray)
    # a folder whose path only ends like the package's, one named like it plus more, its parent folder
    assert not ray_reaper.is_ray_process(["python", "/xopt/env/ray/tool.py"], ray)
    assert not ray_reaper.is_ray_process(["python", "/opt/env/ray/tool.py"], "/opt/env/rayX")
    assert not ray_reaper.is_ray_process(["python", "/opt/env/ray/tool.py"], "/opt/env/ray ")
    # the package named only as a later argument: a user's program given a path
    assert not ray_reaper.is_ray_process(["python", "-u", "tool.py", "/opt/env/ray/x.py"], ray)


def test_session_processes_take_each_naming_one_and_read_whole_arguments(tmp_path, ray_dir, procs):
    session = tmp_path / "session_1"
    (session / "logs").mkdir(parents=True)
    exact = _ray_program(procs, ray_dir, str(session))  # the folder itself as an argument
    naming = _ray_program(procs, ray_dir, f"--log-dir={session}/logs")
    # a name that is not UTF-8 (read with replacement characters)
    odd = _ray_program(procs, ray_dir, f"--log-dir={session}/logs/" + os.fsdecode(b"\xff"))
    later = subprocess.Popen([sys.executable, "-c", SLEEP, f"{ray_dir}/x.py", f"--log-dir={session}/logs"])
    procs.append(_started(later))  # the package only as its 4th argument: not Ray's
    found = ray_reaper.session_processes(str(session), str(ray_dir))
    assert sorted(found) == sorted([exact.pid, naming.pid, odd.pid])
    # folders that differ from the session's only at the end
    near = _ray_program(procs, ray_dir, f"--log-dir={tmp_path}/sess/logs")
    for other in ("sessX", "sess "):
        assert ray_reaper.session_processes(str(tmp_path / other), str(ray_dir)) == []
    assert ray_reaper.session_processes(str(tmp_path / "sess"), str(ray_dir)) == [near.pid]


def test_a_process_that_ends_while_it_is_read_does_not_stop_the_search(tmp_path, ray_dir, procs, monkeypatch):
    session = tmp_path / "session_1"
    (session / "logs").mkdir(parents=True)
    with open(session / "logs" / "out", "w") as log:
        holders = {_ray_program(procs, ray_dir, stdout=log).pid, _ray_program(procs, ray_dir, stdout=log).pid}
    real, gone = os.readlink, []

    def readlink(path):
        pid = int(path.split("/")[2])
        if pid in holders and (not gone or gone[0] == pid):  # the first holder read has just ended
            gone.append(pid)
            raise FileNotFoundError(2, "No such file or directory", path)
        return real(path)
    monkeypatch.setattr(os, "readlink", readlink)
    found = ray_reaper.session_processes(str(session), str(ray_dir))
    assert gone and found == sorted(holders - {gone[0]})


def test_a_process_gone_before_its_state_is_read_is_left_out(tmp_path, ray_dir, procs, monkeypatch):
    session = tmp_path / "session_1"
    (session / "logs").mkdir(parents=True)
    naming = _ray_program(procs, ray_dir, f"--log-dir={session}/logs")
    gone = _ray_program(procs, ray_dir, f"--log-dir={session}/logs")
    real = ray_reaper._stat
    monkeypatch.setattr(ray_reaper, "_stat", lambda pid: None if pid == str(gone.pid) else real(pid))  # ended
    assert ray_reaper.session_processes(str(session), str(ray_dir)) == [naming.pid]


def test_sweep_spares_a_running_drivers_own_processes(tmp_path, ray_dir, procs):
    session = tmp_path / "session_1"
    (session / "logs").mkdir(parents=True)
    mine = _ray_program(procs, ray_dir, f"--log-dir={session}/logs")  # a child of this process, the driver
    assert ray_reaper.sweep(str(session), str(ray_dir), driver=os.getpid(), pause=0.01) == []
    assert mine.poll() is None
    assert ray_reaper.sweep(str(session), str(ray_dir), pause=0.01) == [mine.pid]
    assert mine.wait(timeout=60) == -signal.SIGKILL


def test_alive_only_probes(procs, monkeypatch):
    proc = subprocess.Popen([sys.executable, "-c", SLEEP])
    procs.append(proc)
    real, sent = os.kill, []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)) or real(pid, sig))
    assert ray_reaper._alive(proc.pid) is True
    assert sent == [(proc.pid, 0)] and proc.poll() is None
    proc.kill()
    proc.wait(timeout=60)
    assert ray_reaper._alive(proc.pid) is False

    def refuse(pid, sig):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "kill", refuse)
    assert ray_reaper._alive(proc.pid) is True  # another user's live process


def _wait_in_thread(pid, read_fd, write_fd):
    """wait_for_driver (polling every 0.05 s) in a thread, waited for at most a minute; a wait that does not
    end is released with a line and fails the test."""
    out = []
    thread = threading.Thread(target=lambda: out.append(ray_reaper.wait_for_driver(pid, read_fd, poll_s=0.05)),
                              daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        os.write(write_fd, b"done\n")
        thread.join(timeout=60)
        pytest.fail("wait_for_driver did not return")
    return out[0]


def test_without_pidfd_the_reaper_polls_for_a_line_or_the_drivers_death(procs, monkeypatch):
    monkeypatch.delattr(os, "pidfd_open")
    driver = subprocess.Popen([sys.executable, "-c", SLEEP])
    procs.append(driver)
    read, write = os.pipe()
    try:
        threading.Timer(0.3, os.write, (write, b"done\n")).start()
        assert _wait_in_thread(driver.pid, read, write) == "done"  # polled while the driver runs: not dead
    finally:
        os.close(read)
        os.close(write)
    read, write = os.pipe()
    try:
        threading.Timer(0.3, lambda: (driver.kill(), driver.wait(timeout=60))).start()
        assert _wait_in_thread(driver.pid, read, write) == "died"
    finally:
        os.close(read)
        os.close(write)


class _Stdin:
    def __init__(self, fd):
        self.fd = fd

    def fileno(self):
        return self.fd


DRIVER = ("import subprocess, sys, time\n"
          "child = subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]])\n"
          "print(child.pid, flush=True)\n"
          "time.sleep(300)\n")


def _kill_if_sleeper(pid, ray_dir):
    """SIGKILL ``pid`` if it still runs the sleeper of ``ray_dir`` (not a reused pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if str(ray_dir / "sleeper.py").encode() in f.read():
                os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def test_main_ends_the_session_once_the_driver_is_done_or_dead(tmp_path, ray_dir, procs, monkeypatch, request):
    session = tmp_path / "session_1"
    (session / "logs").mkdir(parents=True)
    made = tmp_path / "made"
    (made / "sub").mkdir(parents=True)
    names = f"--log-dir={session}/logs"
    with open(session / "logs" / "out", "w") as log:
        orphan = _ray_program(procs, ray_dir, stdout=log)  # not of the driver's family: ended
    other = _ray_program(procs, ray_dir, f"--log-dir={session}_2/logs")  # another session's: kept
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(ray_dir / "sleeper.py"), names],
                              stdout=subprocess.PIPE, text=True)
    procs.append(driver)
    drivers_own = int(driver.stdout.readline())
    request.addfinalizer(lambda: _kill_if_sleeper(drivers_own, ray_dir))
    _started(driver, drivers_own)
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", _Stdin(read))
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGINT)}
    try:
        os.write(write, b"done\n")  # what shutdown_ray says while the driver still runs
        assert ray_reaper.main([str(driver.pid), str(session), str(ray_dir), str(made)]) == 0
        assert signal.getsignal(signal.SIGHUP) == signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.close(read)
        os.close(write)
    assert orphan.wait(timeout=60) == -signal.SIGKILL
    assert not made.exists()
    assert driver.poll() is None and ray_reaper._stat(str(drivers_own))[0] not in "ZX"  # the driver's own: kept
    assert other.poll() is None

    driver.kill()
    driver.wait(timeout=60)  # dead: its Ray child, now an orphan, is the session's to end
    read, write = os.pipe()
    monkeypatch.setattr(sys, "stdin", _Stdin(read))
    try:
        assert ray_reaper.main([str(driver.pid), str(session), str(ray_dir), str(tmp_path / "never_made")]) == 0
        assert _ended(drivers_own)
        assert ray_reaper.main([str(driver.pid), str(session), str(ray_dir)]) == 0  # nothing to remove
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.close(read)
        os.close(write)
    assert other.poll() is None and (tmp_path / "ray").is_dir()
    shutil.rmtree(session)
