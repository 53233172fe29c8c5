"""One run per folder: the lock is atomic, held by the process, released on exit, and a stale lock
of a dead process is taken over and named; metrics records are appended whole."""
import json
import os
import signal
import subprocess
import sys

import pytest
import ray

from mindspeed_rl.utils.loggers import _Records, read_records
from mindspeed_rl.utils.run_lock import LOCK_FILE, RunLock, RunLockError, RunLocks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HOLD = ("import sys, time\nfrom mindspeed_rl.utils.run_lock import RunLock\n"
        "RunLock(sys.argv[1], '--output-dir').acquire()\nprint('held', flush=True)\ntime.sleep(600)\n")


def _holder(folder):
    """A process that takes the lock of ``folder`` and keeps it (until killed)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_is_refused_naming_the_owner_and_gets_the_folder_once_it_ends(tmp_path, capsys):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(RunLockError) as info:
            RunLock(str(tmp_path), "--output-dir").acquire()
        text = str(info.value)
        assert f"--output-dir '{tmp_path}' is in use by another run (pid {proc.pid} on host" in text
        assert "\n" not in text
    finally:
        proc.kill()
        proc.wait(timeout=60)
    # the kernel dropped the killed holder's lock: the next run takes it, naming what it took over
    lock = RunLock(str(tmp_path), "--output-dir").acquire()
    out = capsys.readouterr().out
    assert f"pid {proc.pid}" in out and "its pid is not running" in out and "taken over" in out
    assert lock.took_over["pid"] == proc.pid
    with open(tmp_path / LOCK_FILE) as f:
        assert json.load(f)["pid"] == os.getpid()
    lock.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # a clean release leaves an empty (free) lock file
    with RunLock(str(tmp_path), "--output-dir") as again:
        assert again.took_over is None
    assert capsys.readouterr().out == ""


def test_the_same_folder_twice_in_one_process_is_refused_too(tmp_path):
    with RunLock(str(tmp_path), "--output-dir"):
        with pytest.raises(RunLockError, match="in use by another run"):
            RunLock(str(tmp_path), "megatron_training.save").acquire()


def test_locks_of_run_and_save_folder_are_all_or_nothing(tmp_path):
    out, save = tmp_path / "out", tmp_path / "ckpt"
    proc = _holder(save)
    try:
        with pytest.raises(RunLockError, match=r"megatron_training.save '.*ckpt' is in use"):
            with RunLocks([("--output-dir", str(out)), ("megatron_training.save", str(save))]):
                pass
        with RunLock(str(out), "--output-dir"):  # the run folder's lock was given back
            pass
    finally:
        proc.kill()
        proc.wait(timeout=60)
    with RunLocks([("--output-dir", str(out)), ("megatron_training.save", str(out)), ("x", None)]) as both:
        assert len(both.locks) == 1  # one folder named twice is locked once


def test_a_file_in_place_of_the_folder_is_named(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunLockError, match="is a file, not a folder"):
        RunLock(str(tmp_path / "f"), "--output-dir").acquire()


def test_two_writers_append_whole_records(tmp_path):
    """Two descriptors on one metrics file (what two runs had): every record arrives whole."""
    path = str(tmp_path / "metrics.jsonl")
    first, second = _Records(path, fresh=True), _Records(path, fresh=False)
    big = "x" * 20000  # larger than any stdio buffer
    for i in range(6):
        (first if i % 2 == 0 else second).write([{"iteration": i, "pad": big}])
    first.close()
    second.close()
    assert [r["iteration"] for r in read_records(path)] == list(range(6))


def test_cli_run_into_a_held_folder_stops_before_ray(tmp_path, capsys):
    sys.path.insert(0, ROOT)
    from cli.train_grpo import main
    from mindspeed_rl.models.tiny_model import build_tiny_checkpoint
    model = build_tiny_checkpoint(tmp_path / "model")
    out = tmp_path / "out"
    capsys.readouterr()
    with RunLock(str(out), "--output-dir"):  # a run that started a moment earlier
        code = main(["--config", os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml"), "--output-dir", str(out),
                     f"megatron_training.model_path={model}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: --output-dir '{out}' is in use by another run (pid {os.getpid()}")
    assert not ray.is_initialized() and not (out / "metrics.jsonl").exists()


def test_lock_is_released_by_a_process_that_dies(tmp_path):
    proc = _holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    with RunLock(str(tmp_path), "--output-dir") as lock:
        assert lock.took_over["pid"] == proc.pid


def test_a_lock_left_by_a_run_on_another_host_is_not_taken_over(tmp_path, capsys):
    owner = {"pid": 4242, "host": "node-b", "started": 0}
    (tmp_path / LOCK_FILE).write_text(json.dumps(owner) + "\n")
    with pytest.raises(RunLockError) as info:
        RunLock(str(tmp_path), "--output-dir").acquire()
    path = tmp_path / LOCK_FILE
    assert str(info.value).startswith(f"--output-dir '{tmp_path}' holds the lock of a run on another host (pid 4242 "
                                      f"on host node-b, started ")
    assert str(info.value).endswith(f"; lock {path}), which cannot be checked from here: give this run its own "
                                    f"folder, or, if that run has ended, delete {path} and start again")
    assert json.loads(path.read_text()) == owner and capsys.readouterr().out == ""  # nothing taken, nothing said
    path.unlink()  # what the line says to do once that run has ended
    with RunLock(str(tmp_path), "--output-dir") as lock:
        assert lock.took_over is None


def test_a_live_pid_that_does_not_hold_the_lock_is_named_as_such(tmp_path, capsys):
    import socket
    # a live process of our own (not the parent: checking a pid must not signal it, and a mutant that did
    # would hit whatever runs this test)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": other.pid, "host": socket.gethostname()}) + "\n")
        with RunLock(str(tmp_path), "--output-dir") as lock:
            assert lock.took_over["pid"] == other.pid
        with pytest.raises(subprocess.TimeoutExpired):  # the check sent no signal that ended it
            other.wait(timeout=0.5)
    finally:
        other.kill()
        other.wait(timeout=60)
    assert "its pid runs now but does not hold the lock (another process)); taken over" in capsys.readouterr().out


def test_one_folder_spelled_two_ways_is_locked_once(tmp_path):
    real = tmp_path / "run"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    spellings = [("--output-dir", str(real)), ("megatron_training.save", str(real) + "/"),
                 ("megatron_training.load", str(tmp_path / "link")), ("x", str(tmp_path / "." / "run"))]
    with RunLocks(spellings) as locks:
        assert len(locks.locks) == 1
