"""ray_utils without a Ray: ray.init faked, a node faked where a reaper needs one; the reapers themselves are real
processes (ray_reaper.py) started and stopped here."""
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import pytest
import ray

from mindspeed_rl.utils import ray_reaper, ray_utils

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
RAY_PACKAGE = os.path.dirname(os.path.abspath(ray.__file__))


@pytest.fixture(autouse=True)
def _clean_state():
    """No reaper or /tmp folder of this process left by another test, and none left by this one."""
    assert not ray_utils._REAPERS and not ray_utils._OWN_TEMP_DIRS
    yield
    for proc in ray_utils._REAPERS:
        proc.kill()
        proc.wait(timeout=60)
    ray_utils._REAPERS.clear()
    ray_utils._OWN_TEMP_DIRS.clear()


@pytest.fixture
def fake_ray(monkeypatch):
    calls = {"init": [], "shutdown": 0}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls["init"].append(kw))

    def shutdown():
        calls["shutdown"] += 1
    monkeypatch.setattr(ray, "shutdown", shutdown)
    monkeypatch.setattr(ray._private.worker, "_global_node", None, raising=False)  # no node: no reaper
    return calls


@pytest.fixture
def short_dir():
    """A folder under /tmp short enough for Ray's session files (pytest's tmp_path is not)."""
    path = tempfile.mkdtemp(prefix="r", dir="/tmp")
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def node(monkeypatch, tmp_path):
    """A started local node as _start_reaper sees it: only its session folder."""
    session = tmp_path / "session_1"
    session.mkdir()
    monkeypatch.setattr(ray._private.worker, "_global_node",
                        SimpleNamespace(get_session_dir_path=lambda: str(session)), raising=False)
    return session


def _raise(err):
    raise err


def _cmdline(pid):
    """The arguments of ``pid``, once its exec has set them (bounded wait: a just started child may not be there)."""
    for _ in range(6000):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
        if raw:
            return [os.fsdecode(arg) for arg in raw.split(b"\0")[:-1]]
        time.sleep(0.01)
    raise AssertionError(f"process {pid} shows no arguments")


@LINUX
def test_a_reaper_is_started_in_its_own_session_for_this_driver_and_ends_when_told(node, tmp_path):
    made = tmp_path / "made"
    (made / "sub").mkdir(parents=True)
    proc = ray_utils._start_reaper(str(made))
    assert ray_utils._REAPERS == [proc]
    assert _cmdline(proc.pid) == [sys.executable, "-I", "-S", ray_reaper.__file__, str(os.getpid()), str(node),
                                  RAY_PACKAGE, str(made)]
    assert os.getsid(proc.pid) == proc.pid  # a closed terminal or Ctrl-C does not reach it
    assert os.readlink(f"/proc/{proc.pid}/fd/1") == os.readlink(f"/proc/{proc.pid}/fd/2") == "/dev/null"
    assert os.readlink(f"/proc/{proc.pid}/fd/0").startswith("pipe:")
    assert proc.poll() is None  # waits for this process
    ray_utils._stop_reapers()
    assert proc.returncode == 0 and not ray_utils._REAPERS
    assert not made.exists()  # the folder it was given, removed by its last step


@LINUX
def test_a_reaper_without_a_folder_to_remove_gets_no_fourth_argument(node):
    proc = ray_utils._start_reaper(None)
    try:
        assert _cmdline(proc.pid)[4:] == [str(os.getpid()), str(node), RAY_PACKAGE]
    finally:
        ray_utils._stop_reapers()
    assert proc.returncode == 0


def test_no_reaper_without_a_local_node_or_off_linux(monkeypatch, node):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert ray_utils._start_reaper(None) is None
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ray._private.worker, "_global_node", None)
    assert ray_utils._start_reaper(None) is None
    assert not ray_utils._REAPERS


def _fake_reaper(tmp_path, name, then_sleep=False):
    """A process that copies its stdin, up to its end, into ``name`` and then ends (or sleeps until this process
    ends, at most 5 minutes)."""
    code = (f"import os, sys, time; parent = os.getppid(); data = sys.stdin.read(); "
            f"open({str(tmp_path / name)!r}, 'w').write(data)"
            + ("\nfor _ in range(3000):\n    if os.getppid() != parent: break\n    time.sleep(0.1)" if then_sleep else ""))
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)


def _bounded(fn, release):
    """``fn()`` in a thread, waited for at most a minute; one that does not end is released and fails."""
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    thread.join(timeout=60)
    if thread.is_alive():
        release()
        thread.join(timeout=60)
        pytest.fail("did not return")


def test_stopping_says_done_closes_the_pipe_and_waits_for_each_reaper(tmp_path):
    first, second = _fake_reaper(tmp_path, "first"), _fake_reaper(tmp_path, "second")
    ray_utils._REAPERS.extend([first, second])
    ray_utils._stop_reapers()
    assert first.returncode == second.returncode == 0 and not ray_utils._REAPERS  # waited for
    assert (tmp_path / "first").read_text() == (tmp_path / "second").read_text() == "done\n"  # then end of file


def test_a_reaper_that_ended_or_does_not_end_does_not_stop_the_shutdown(tmp_path, monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
    gone.wait(timeout=60)  # its pipe has no reader: the line cannot be written
    stays = _fake_reaper(tmp_path, "stays", then_sleep=True)
    monkeypatch.setattr(ray_utils, "REAPER_WAIT_S", 0.1)
    ray_utils._REAPERS.extend([stays, gone])
    try:
        _bounded(ray_utils._stop_reapers, stays.kill)  # the default wait, bounded
        assert not ray_utils._REAPERS and stays.poll() is None
        for _ in range(6000):  # it was told: what it read lands in its file (bounded wait)
            if (tmp_path / "stays").exists() and (tmp_path / "stays").read_text():
                break
            time.sleep(0.01)
        assert (tmp_path / "stays").read_text() == "done\n" and gone.returncode == 0
    finally:
        stays.kill()
        stays.wait(timeout=60)


def test_at_exit_shuts_down_only_what_this_process_started(fake_ray, tmp_path):
    ray_utils._at_exit()
    assert fake_ray["shutdown"] == 0  # nothing started here: another owner's Ray is left alone
    folder = tmp_path / "msrl_ray_x"
    folder.mkdir()
    ray_utils._OWN_TEMP_DIRS.append(str(folder))
    ray_utils._at_exit()
    assert fake_ray["shutdown"] == 1 and not folder.exists() and not ray_utils._OWN_TEMP_DIRS
    done = _fake_reaper(tmp_path, "reaper")
    ray_utils._REAPERS.append(done)
    ray_utils._at_exit()
    assert fake_ray["shutdown"] == 2 and done.returncode == 0 and (tmp_path / "reaper").read_text() == "done\n"


def test_shutdown_removes_every_folder_made_and_stops_the_reapers(fake_ray, tmp_path):
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        (folder / "sub").mkdir(parents=True)
    ray_utils._OWN_TEMP_DIRS.extend(map(str, folders))
    reaper = _fake_reaper(tmp_path, "reaper")
    ray_utils._REAPERS.append(reaper)
    ray_utils.shutdown_ray()
    assert fake_ray["shutdown"] == 1 and not any(f.exists() for f in folders) and not ray_utils._OWN_TEMP_DIRS
    assert reaper.returncode == 0


def test_local_system_config_copies_the_defaults():
    config = ray_utils.local_system_config()
    assert config == ray_utils.LOCAL_HEALTH_CHECKS and config is not ray_utils.LOCAL_HEALTH_CHECKS
    config["health_check_period_ms"] = 1
    assert ray_utils.local_system_config({"health_check_timeout_ms": 5})["health_check_timeout_ms"] == 5
    assert ray_utils.LOCAL_HEALTH_CHECKS == {"health_check_period_ms": 10_000, "health_check_timeout_ms": 60_000,
                                             "health_check_failure_threshold": 10}  # README and docs say these


def _blocked():
    return signal.SIGHUP in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_hangup_held_puts_back_the_mask_it_found():
    assert not _blocked()
    with ray_utils.hangup_held():
        assert _blocked()
    assert not _blocked()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        with ray_utils.hangup_held():
            assert _blocked()
        assert _blocked()  # blocked before: still blocked
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGHUP})
    with pytest.raises(KeyError):
        with ray_utils.hangup_held():
            raise KeyError("start failed")
    assert not _blocked()


@pytest.mark.parametrize("missing", [AttributeError, OSError, ValueError])
def test_hangup_held_runs_the_body_once_where_masks_do_not_exist(monkeypatch, missing):
    def no_masks(*args):
        raise missing("no signal masks")
    monkeypatch.setattr(signal, "pthread_sigmask", no_masks)
    ran = []
    with ray_utils.hangup_held():
        ran.append(1)
    assert ran == [1]


def test_path_problems_are_named(monkeypatch):
    at_limit = "/" + "x" * (ray_utils.MAX_TEMP_DIR_LEN - 1)
    assert ray_utils.ray_path_problem(at_limit) is None
    assert ray_utils.ray_path_problem(at_limit + "x") == (
        f"longer than the {ray_utils.MAX_TEMP_DIR_LEN} bytes Ray's socket paths leave")
    assert ray_utils.ray_path_problem("/tmp/é") == "Ray cannot take a path with non-ASCII characters"
    assert ray_utils.session_dir_for(None) is None
    monkeypatch.chdir("/")
    assert ray_utils.session_dir_for("rel") == "/rel"  # a relative folder made absolute
    assert ray_utils.session_dir_for(at_limit + "x") is None


def test_stale_folders_only_of_owners_that_no_longer_run(tmp_path, monkeypatch):
    for name in (f"msrl_ray_{os.getpid()}_mine", "msrl_ray_x1_bad", "msrl_ray_123456789_other"):
        (tmp_path / name).mkdir()

    def owner(pid, sig):
        assert sig == 0 and pid == 123456789
        raise PermissionError(1, "Operation not permitted")  # another user's live process
    monkeypatch.setattr(os, "kill", owner)
    assert ray_utils.remove_stale_temp_dirs(str(tmp_path)) == []
    assert len(os.listdir(tmp_path)) == 3

    def gone(pid, sig):
        raise ProcessLookupError(3, "No such process")
    monkeypatch.setattr(os, "kill", gone)
    assert ray_utils.remove_stale_temp_dirs(str(tmp_path)) == [str(tmp_path / "msrl_ray_123456789_other")]
    assert sorted(os.listdir(tmp_path)) == [f"msrl_ray_{os.getpid()}_mine", "msrl_ray_x1_bad"]  # this process's


def test_a_temporary_folder_ray_cannot_use_is_refused_in_one_line(monkeypatch, tmp_path):
    long = str(tmp_path / ("y" * ray_utils.MAX_TEMP_DIR_LEN))
    monkeypatch.setattr(os.path, "isdir", lambda path: False)  # no /tmp
    monkeypatch.setattr(ray_utils.tempfile, "gettempdir", lambda: long)
    with pytest.raises(ValueError) as info:
        ray_utils._short_temp_dir()
    assert str(info.value) == (
        f"Ray's session files need a short ASCII folder: {long!r} (the temporary folder) is not one (longer than "
        f"the {ray_utils.MAX_TEMP_DIR_LEN} bytes Ray's socket paths leave); set TMPDIR to such a folder")
    assert not ray_utils._OWN_TEMP_DIRS


def test_the_session_folder_goes_under_the_temporary_folder_without_tmp(monkeypatch, short_dir):
    base = short_dir
    (base / "msrl_ray_123456789_old").mkdir()
    monkeypatch.setattr(os.path, "isdir", lambda path: path != "/tmp")
    monkeypatch.setattr(ray_utils.tempfile, "gettempdir", lambda: str(base))
    monkeypatch.setattr(os, "kill", lambda pid, sig: _raise(ProcessLookupError(3, "No such process")))
    path = ray_utils._short_temp_dir()
    assert os.path.dirname(path) == str(base) and os.path.basename(path).startswith(f"msrl_ray_{os.getpid()}_")
    assert os.listdir(base) == [os.path.basename(path)]  # a dead owner's folder removed first
    assert ray_utils._OWN_TEMP_DIRS == [path]


def test_the_exit_hook_is_registered_once(monkeypatch):
    hooks = []
    monkeypatch.setattr(ray_utils.atexit, "register", hooks.append)
    monkeypatch.setattr(ray_utils, "_atexit_registered", False)
    try:
        first, second = ray_utils._short_temp_dir(), ray_utils._short_temp_dir()
        assert hooks == [ray_utils._at_exit] and ray_utils._atexit_registered is True
        assert ray_utils._OWN_TEMP_DIRS == [first, second] and first != second
    finally:
        ray_utils._remove_own_temp_dirs()


def test_init_passes_its_arguments_and_quiets_the_token_notice(fake_ray, monkeypatch, short_dir):
    notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
    monkeypatch.setattr(notice, "level", logging.NOTSET)
    run = short_dir / "run"
    assert ray_utils.init_ray(temp_dir=str(run), num_cpus=3, namespace="ns") is True
    (kw,) = fake_ray["init"]
    assert kw == {"_node_ip_address": "127.0.0.1", "num_cpus": 3, "include_dashboard": False,
                  "_temp_dir": str(run), "_system_config": ray_utils.LOCAL_HEALTH_CHECKS, "namespace": "ns"}
    assert run.is_dir() and not ray_utils._OWN_TEMP_DIRS  # the run's own folder: made, not to be removed
    assert notice.level == logging.ERROR
    ray_utils.shutdown_ray()
    assert run.is_dir()


def test_init_does_nothing_when_ray_runs_and_joins_a_cluster_with_retries(fake_ray, monkeypatch):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    assert ray_utils.init_ray() is False and fake_ray["init"] == [] and fake_ray["shutdown"] == 0
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    tries = []

    def refuse(**kw):
        tries.append(kw)
        raise ConnectionError("no GCS")
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray_utils, "INIT_BACKOFF_S", 0)
    with pytest.raises(ray_utils.RayStartError) as info:
        ray_utils.init_ray(namespace="ns")
    assert str(info.value) == ("could not join the Ray cluster at RAY_ADDRESS=127.0.0.1:1 after 3 attempts: "
                               "ConnectionError: no GCS")
    assert tries == [{"address": "127.0.0.1:1", "namespace": "ns"}] * 3


def test_init_removes_the_folders_of_a_session_ended_with_a_plain_shutdown(fake_ray, tmp_path, short_dir):
    left = tmp_path / "left"
    left.mkdir()
    ray_utils._OWN_TEMP_DIRS.append(str(left))
    ray_utils.init_ray(temp_dir=str(short_dir / "run"))
    assert not left.exists() and not ray_utils._OWN_TEMP_DIRS


@LINUX
def test_a_local_start_gets_a_reaper_for_the_folder_it_made(fake_ray, node):
    ray_utils.init_ray()
    (made,) = ray_utils._OWN_TEMP_DIRS
    (reaper,) = ray_utils._REAPERS
    assert _cmdline(reaper.pid)[5:] == [str(node), RAY_PACKAGE, made]
    ray_utils.shutdown_ray()
    assert reaper.returncode == 0 and not os.path.exists(made)


@LINUX
def test_a_run_folder_gets_a_reaper_that_removes_nothing(fake_ray, node, short_dir):
    ray_utils.init_ray(temp_dir=str(short_dir / "run"))
    (reaper,) = ray_utils._REAPERS
    assert _cmdline(reaper.pid)[5:] == [str(node), RAY_PACKAGE]
    ray_utils.shutdown_ray()
    assert reaper.returncode == 0 and (short_dir / "run").is_dir()


def test_a_failed_start_leaves_no_folder(fake_ray, monkeypatch):
    def fail(**kw):
        fake_ray["init"].append(kw)
        raise ValueError("bad argument")
    monkeypatch.setattr(ray, "init", fail)
    with pytest.raises(ValueError, match="^bad argument$"):
        ray_utils.init_ray()
    assert len(fake_ray["init"]) == 1  # wrong arguments: not retried
    assert fake_ray["shutdown"] >= 1 and not os.path.exists(fake_ray["init"][0]["_temp_dir"])
    assert not ray_utils._OWN_TEMP_DIRS


def test_retries_wait_twice_as_long_each_time_by_default(monkeypatch, capsys):
    calls, waits, shutdowns = [], [], []

    def broken_shutdown():
        shutdowns.append(1)
        raise RuntimeError("nothing to shut down")
    monkeypatch.setattr(ray, "shutdown", broken_shutdown)

    def start():
        calls.append(1)
        raise Exception("x" * 400 + " end")
    with pytest.raises(ray_utils.RayStartError) as info:
        ray_utils._with_retries(start, "a local Ray did not start", sleep=waits.append)
    assert len(calls) == 3 and waits == [2.0, 4.0] and len(shutdowns) == 3  # each failed attempt shut down
    assert str(info.value) == "a local Ray did not start after 3 attempts: Exception: " + "x" * 300
    assert isinstance(info.value.__cause__, Exception)
    out = capsys.readouterr().out.splitlines()
    assert out == ["warning: ray.init attempt 1 of 3 failed (Exception); retrying in 2s",
                   "warning: ray.init attempt 2 of 3 failed (Exception); retrying in 4s"]


def test_a_start_that_works_is_not_retried(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    ray_utils._with_retries(lambda: calls.append("start"), "x", sleep=calls.append)
    assert calls == ["start"]
    with pytest.raises(TypeError):
        ray_utils._with_retries(lambda: calls.append("typed") or _raise(TypeError("kw")), "x", sleep=calls.append)
    assert calls == ["start", "typed"]


class _Stdout:
    """A redirected stdout: records what is written and when it is flushed, in one list with other events."""

    def __init__(self, events):
        self.events = events

    def write(self, text):
        self.events.append(("write", text))
        return len(text)

    def flush(self):
        self.events.append(("flush",))


def _lines_flushed(events):
    """The printed lines, each with whether it was flushed before the next event that is not a write."""
    lines, text = [], ""
    for i, event in enumerate(events):
        if event[0] == "write":
            text += event[1]
            continue
        if event[0] == "flush" and text:
            lines.extend((line, True) for line in text.splitlines())
            text = ""
    return lines + [(line, False) for line in text.splitlines()]


def test_a_retry_warning_reaches_a_redirected_log_before_the_wait(monkeypatch):
    events = []
    monkeypatch.setattr(sys, "stdout", _Stdout(events))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    tries = []

    def start():
        tries.append(1)
        if len(tries) == 1:
            raise Exception("timed out")
    ray_utils._with_retries(start, "x", sleep=lambda s: events.append(("sleep", s)))
    assert events[-1] == ("sleep", 2.0)
    assert _lines_flushed(events[:-1]) == [
        ("warning: ray.init attempt 1 of 3 failed (Exception); retrying in 2s", True)]


def test_the_moved_session_note_reaches_a_redirected_log_before_ray_starts(fake_ray, monkeypatch, short_dir):
    events = []
    monkeypatch.setattr(sys, "stdout", _Stdout(events))
    monkeypatch.setattr(ray, "init", lambda **kw: events.append(("init",)))
    ray_utils.init_ray(temp_dir=str(short_dir / "运行"))
    at = events.index(("init",))
    (line, flushed), = _lines_flushed(events[:at])
    assert line.startswith("note: Ray's session files go to /tmp/msrl_ray_") and flushed
    ray_utils.shutdown_ray()


def test_tmp_is_taken_over_a_temporary_folder_set_elsewhere(monkeypatch, short_dir):
    """TMPDIR (a long one on macOS) only serves where there is no /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(short_dir))
    try:
        path = ray_utils._short_temp_dir()
        assert os.path.dirname(path) == "/tmp"
        assert os.listdir(short_dir) == []
    finally:
        ray_utils._remove_own_temp_dirs()


def test_joining_a_cluster_says_this_call_started_ray(fake_ray, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    assert ray_utils.init_ray() is True  # the caller disconnects with shutdown_ray
    assert fake_ray["init"] == [{"address": "127.0.0.1:1"}]


def test_a_local_ray_that_never_starts_is_one_line(fake_ray, monkeypatch):
    def fail(**kw):
        fake_ray["init"].append(kw)
        raise Exception("The current node timed out during startup.")
    monkeypatch.setattr(ray, "init", fail)
    monkeypatch.setattr(ray_utils, "INIT_BACKOFF_S", 0)
    with pytest.raises(ray_utils.RayStartError) as info:
        ray_utils.init_ray()
    assert str(info.value) == ("a local Ray did not start after 3 attempts: Exception: The current node timed out "
                               "during startup.")
    assert len(fake_ray["init"]) == 3 and not os.path.exists(fake_ray["init"][0]["_temp_dir"])


def test_an_explicit_wait_for_the_reapers_is_used(tmp_path, monkeypatch):
    stays = _fake_reaper(tmp_path, "stays", then_sleep=True)
    monkeypatch.setattr(ray_utils, "REAPER_WAIT_S", 3600.0)
    ray_utils._REAPERS.append(stays)
    try:
        _bounded(lambda: ray_utils._stop_reapers(wait=0.1), stays.kill)
        assert not ray_utils._REAPERS and stays.poll() is None
    finally:
        stays.kill()
        stays.wait(timeout=60)


@pytest.mark.parametrize("first_owner", ["runs", "another user's"])
def test_stale_folders_are_found_past_a_live_owner_and_by_the_pid_alone(tmp_path, monkeypatch, first_owner):
    names = ["msrl_ray_111111111_a_b", "msrl_ray_222222222_c_d", "ray_tmp__333333333_e"]  # the last: not a run's
    for name in names:
        (tmp_path / name).mkdir()
    asked = []

    def kill(pid, sig):
        asked.append(pid)
        if len(asked) == 1:  # the first owner asked is live
            if first_owner == "runs":
                return
            raise PermissionError(1, "Operation not permitted")
        shutil.rmtree(tmp_path / f"msrl_ray_{pid}_{'a_b' if pid == 111111111 else 'c_d'}")  # another run got it
        raise ProcessLookupError(3, "No such process")
    monkeypatch.setattr(os, "kill", kill)
    removed = ray_utils.remove_stale_temp_dirs(str(tmp_path))
    assert sorted(asked) == [111111111, 222222222]
    gone = names[0] if asked[1] == 111111111 else names[1]
    assert removed == [str(tmp_path / gone)]  # removed meanwhile by another run: no error
    assert sorted(os.listdir(tmp_path)) == sorted(set(names) - {gone})
