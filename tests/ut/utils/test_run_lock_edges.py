"""The run lock's edges: owner lines, unreadable lock files, folders that cannot hold a lock, a file system
without flock, the lock file's mode and contents, a lock left by this very process, and releases."""
import errno
import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime

import pytest

from mindspeed_rl.utils import run_lock
from mindspeed_rl.utils.run_lock import LOCK_FILE, RunLock, RunLockError, RunLocks, pid_alive, _owner_text, _read_owner

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return proc.pid


def _read(tmp_path, data: bytes):
    path = tmp_path / "lock"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    try:
        os.lseek(fd, 3, os.SEEK_SET)  # _read_owner reads from the start whatever the offset
        return _read_owner(fd)
    finally:
        os.close(fd)


def test_owner_text_names_pid_host_and_local_start_time():
    started = 1_000_000_000.5
    when = datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S")
    assert _owner_text({"pid": 7, "host": "node-a", "started": started}) == \
        f"pid 7 on host node-a, started {when}"
    assert _owner_text({"pid": 7, "host": "node-a", "started": 12}) == \
        f"pid 7 on host node-a, started {datetime.fromtimestamp(12).strftime('%Y-%m-%d %H:%M:%S')}"


def test_owner_text_of_missing_or_odd_fields_says_question_marks():
    assert _owner_text({}) == "pid ? on host ?, started ?"
    assert _owner_text({"pid": 3, "host": "h", "started": "yesterday"}) == "pid 3 on host h, started ?"


def test_read_owner_reads_a_file_longer_than_one_read(tmp_path):
    owner = {"pid": 5, "host": "h", "note": "n" * 10000}  # over two of its 4096-byte reads
    assert _read(tmp_path, json.dumps(owner).encode()) == owner


def test_read_owner_of_garbage_keeps_its_first_80_characters(tmp_path):
    assert _read(tmp_path, b"\xff\xfe" + b"g" * 100) == {"pid": "?", "host": "?", "raw": "\ufffd\ufffd" + "g" * 78}
    assert _read(tmp_path, b"not json") == {"pid": "?", "host": "?", "raw": "not json"}


def test_read_owner_of_an_empty_or_non_object_file_is_none(tmp_path):
    assert _read(tmp_path, b"") is None
    assert _read(tmp_path, b"  \n") is None
    assert _read(tmp_path, b"[1, 2]") is None
    assert _read(tmp_path, b'"pid"') is None


def test_alive_of_a_non_integer_pid_is_false():
    assert pid_alive("123") is False and pid_alive(None) is False and pid_alive(1.0) is False


def test_alive_of_a_pid_it_may_not_signal_is_true(monkeypatch):
    def refuse(pid, sig):
        raise PermissionError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(run_lock.os, "kill", refuse)
    assert pid_alive(4242) is True


def test_alive_of_a_dead_and_of_a_live_pid():
    assert pid_alive(_dead_pid()) is False
    assert pid_alive(os.getpid()) is True


def test_a_lock_naming_a_non_integer_pid_on_this_host_is_taken_over_as_not_running(tmp_path, capsys):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": "12", "host": socket.gethostname()}))
    with RunLock(str(tmp_path), "--output-dir") as lock:
        assert lock.took_over == {"pid": "12", "host": socket.gethostname()}
    assert capsys.readouterr().out == (
        f"note: --output-dir '{tmp_path}': a run left its lock without releasing it (pid 12 on host "
        f"{socket.gethostname()}, started ?; its pid is not running); taken over\n")


def test_a_stale_lock_of_a_dead_pid_is_named_in_one_line(tmp_path, capsys):
    pid, started = _dead_pid(), 1_700_000_000
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "started": started}))
    RunLock(str(tmp_path), "megatron_training.save").acquire().release()
    when = datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S")
    assert capsys.readouterr().out == (
        f"note: megatron_training.save '{tmp_path}': a run left its lock without releasing it (pid {pid} on host "
        f"{socket.gethostname()}, started {when}; its pid is not running); taken over\n")


def test_the_take_over_note_is_out_before_the_process_goes_on(tmp_path):
    """The note is flushed at once: a run that dies right after (no exit handlers) has still said it."""
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    code = ("import os, sys\nfrom mindspeed_rl.utils.run_lock import RunLock\n"
            "RunLock(sys.argv[1], '--output-dir').acquire()\nos._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"note: --output-dir '{tmp_path}': a run left its lock") and "taken over" in out.stdout


def test_a_lock_file_left_by_this_very_process_is_no_take_over(tmp_path, capsys):
    """Our own pid on our host (a release that could not empty the file): taken silently."""
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": 1}))
    with RunLock(str(tmp_path), "--output-dir") as lock:
        assert lock.took_over is None
    assert capsys.readouterr().out == ""


def test_the_lock_file_names_this_process_host_and_start(tmp_path):
    before = time.time()
    (tmp_path / LOCK_FILE).write_text(" " * 500)  # a longer old content is cut
    with RunLock(str(tmp_path), "--output-dir"):
        text = (tmp_path / LOCK_FILE).read_text()
        after = time.time()
    owner = json.loads(text)
    assert text.endswith("}\n") and text.count("\n") == 1
    assert set(owner) == {"pid", "host", "started"}
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert before <= owner["started"] <= after


def test_the_lock_file_is_made_rw_r_r(tmp_path):
    old = os.umask(0)
    try:
        with RunLock(str(tmp_path / "run"), "--output-dir"):
            mode = os.stat(tmp_path / "run" / LOCK_FILE).st_mode & 0o777
    finally:
        os.umask(old)
    assert mode == 0o644


def test_a_folder_that_cannot_be_made_is_named_with_the_os_error(tmp_path):
    (tmp_path / "file").write_text("x")
    folder = str(tmp_path / "file" / "run")
    with pytest.raises(RunLockError) as info:
        RunLock(folder, "--output-dir").acquire()
    assert str(info.value) == (f"--output-dir {folder!r} cannot hold a run lock ({folder}/{LOCK_FILE}): "
                               f"NotADirectoryError: Not a directory")


def test_a_file_system_without_flock_is_named(tmp_path, monkeypatch):
    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(run_lock.fcntl, "flock", no_flock)
    with pytest.raises(RunLockError) as info:
        RunLock(str(tmp_path), "--output-dir").acquire()
    assert str(info.value) == (f"--output-dir {str(tmp_path)!r}: cannot lock {tmp_path}/{LOCK_FILE} "
                               f"(OSError: No locks available)")


def test_release_of_a_lock_never_taken_or_released_twice_does_nothing(tmp_path):
    lock = RunLock(str(tmp_path), "--output-dir")
    lock.release()
    lock.acquire()
    lock.release()
    lock.release()
    assert lock.fd is None
    with RunLock(str(tmp_path), "--output-dir") as again:  # free again
        assert again.took_over is None


def test_unset_folders_are_skipped_wherever_they_stand(tmp_path):
    out, save = tmp_path / "out", tmp_path / "save"
    locks = RunLocks([("megatron_training.load", None), ("--output-dir", str(out)), ("x", ""),
                      ("megatron_training.save", str(save))])
    assert [(lk.what, lk.folder) for lk in locks.locks] == [("--output-dir", str(out)),
                                                             ("megatron_training.save", str(save))]
