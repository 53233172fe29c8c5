"""init_ray / shutdown_ray: local sessions stay on loopback, fit Ray's socket-path limit and leave no
/tmp folders behind."""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest
import ray

from mindspeed_rl.utils import ray_utils


@pytest.fixture
def fake_ray(monkeypatch):
    calls = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.update(kw))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.update(shutdown=True))
    return calls


def _dir_of_length(n: int) -> str:
    """A not yet existing folder whose absolute path has exactly ``n`` characters."""
    base = tempfile.mkdtemp(prefix="r", dir="/tmp")
    path = os.path.join(base, "x" * (n - len(base) - 1))
    assert len(path) == n
    return path


def test_local_session_folder_is_removed_at_shutdown(fake_ray):
    assert ray_utils.init_ray() is True
    made = fake_ray["_temp_dir"]
    assert fake_ray["_node_ip_address"] == "127.0.0.1" and os.path.isdir(made)
    assert made.startswith("/tmp/msrl_ray_")
    ray_utils.shutdown_ray()
    assert fake_ray["shutdown"] and not os.path.exists(made)


def test_short_run_folder_keeps_the_session_long_one_falls_back_to_tmp(fake_ray):
    short = _dir_of_length(ray_utils.MAX_TEMP_DIR_LEN)
    ray_utils.init_ray(temp_dir=short)
    assert fake_ray["_temp_dir"] == short
    ray_utils.shutdown_ray()
    assert os.path.isdir(short)  # the run's own folder: kept
    long = _dir_of_length(ray_utils.MAX_TEMP_DIR_LEN + 1)
    ray_utils.init_ray(temp_dir=long)
    made = fake_ray["_temp_dir"]
    assert made != long and made.startswith("/tmp/msrl_ray_") and len(made) <= ray_utils.MAX_TEMP_DIR_LEN
    ray_utils.shutdown_ray()
    assert not os.path.exists(made)
    for path in (short, long):
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_tmp_folder_is_removed_when_the_caller_only_calls_ray_shutdown(tmp_path):
    # a process that ends with a plain ray.shutdown() (as benchmarks did) leaves no /tmp/msrl_ray_* folder
    script = (
        "import ray\n"
        "from mindspeed_rl.utils import ray_utils\n"
        "ray.is_initialized = lambda: False\n"
        "ray.init = lambda **kw: print(kw['_temp_dir'])\n"
        "ray.shutdown = lambda: None\n"
        "ray_utils.init_ray()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    assert out.returncode == 0, out.stderr
    made = out.stdout.strip().splitlines()[-1]
    assert made.startswith("/tmp/msrl_ray_") and not os.path.exists(made)


def _blocked_signals(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)


def test_real_ray_starts_with_a_session_folder_at_the_length_limit():
    """Ray's own check of its socket paths passes at MAX_TEMP_DIR_LEN (the bug: 46-60 character run
    folders failed with 'AF_UNIX path length cannot exceed 107 bytes'). The same local Ray: its GCS holds the
    health-check room, its processes block SIGHUP, the driver does not."""
    run_dir = _dir_of_length(ray_utils.MAX_TEMP_DIR_LEN)
    try:
        assert ray_utils.init_ray(temp_dir=run_dir, num_cpus=1) is True
        assert ray.get(ray.put(7)) == 7
        assert glob.glob(os.path.join(run_dir, "session_*", "sockets", "plasma_store"))
        config = ray._private.state.state.get_system_config()
        assert {k: config[k] for k in ray_utils.LOCAL_HEALTH_CHECKS} == ray_utils.LOCAL_HEALTH_CHECKS
        hup = 1 << (signal.SIGHUP - 1)
        processes = ray._private.worker._global_node.all_processes
        for kind in ("gcs_server", "raylet"):
            assert _blocked_signals(processes[kind][0].process.pid) & hup, kind
        assert not _blocked_signals(os.getpid()) & hup  # the driver's own handler sees it
        reaper = ray_utils._REAPERS[-1]
        assert reaper.poll() is None and os.getsid(reaper.pid) == reaper.pid  # its own session
    finally:
        ray_utils.shutdown_ray()
        shutil.rmtree(os.path.dirname(run_dir), ignore_errors=True)
    assert reaper.returncode == 0 and not ray_utils._REAPERS


def test_a_local_ray_gets_health_check_room_unless_the_environment_or_caller_says_otherwise(fake_ray, monkeypatch):
    ray_utils.init_ray()
    assert fake_ray["_system_config"] == ray_utils.LOCAL_HEALTH_CHECKS
    ray_utils.shutdown_ray()
    # Ray's defaults (3 s, 10 s, 5 misses) are not what a loaded machine needs
    assert ray_utils.LOCAL_HEALTH_CHECKS["health_check_failure_threshold"] * \
        ray_utils.LOCAL_HEALTH_CHECKS["health_check_period_ms"] >= 60_000
    monkeypatch.setenv("RAY_health_check_period_ms", "500")
    ray_utils.init_ray(_system_config={"health_check_failure_threshold": 3, "other_key": 1})
    assert fake_ray["_system_config"] == {"health_check_timeout_ms": 60_000, "health_check_failure_threshold": 3,
                                          "other_key": 1}
    ray_utils.shutdown_ray()


def test_joining_a_cluster_changes_none_of_its_settings(fake_ray, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    ray_utils.init_ray()
    assert fake_ray == {"address": "127.0.0.1:1"}  # the cluster's own health checks, no reaper of ours
    assert not ray_utils._REAPERS
    ray_utils.shutdown_ray()


def test_sighup_is_held_while_ray_starts_and_delivered_after(fake_ray):
    """SIGHUP is blocked in the starting thread while ray.init runs (Ray's processes inherit the mask); one sent
    to that thread meanwhile reaches the driver's handler once Ray has started."""
    got, masks = [], []
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: got.append(signum))

    def init(**kw):
        masks.append(signal.pthread_sigmask(signal.SIG_BLOCK, set()))
        signal.pthread_kill(threading.get_ident(), signal.SIGHUP)
        assert not got  # held
    try:
        ray.init = init
        ray_utils.init_ray()
        assert signal.SIGHUP in masks[0] and got == [signal.SIGHUP]
        assert signal.SIGHUP not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.signal(signal.SIGHUP, previous)
        ray_utils.shutdown_ray()


def test_a_signal_that_stops_the_start_shuts_the_new_ray_down(fake_ray):
    class Stop(BaseException):
        pass

    def stop(signum, frame):
        raise Stop()
    previous = signal.signal(signal.SIGHUP, stop)
    try:
        ray.init = lambda **kw: fake_ray.update(kw) or signal.pthread_kill(threading.get_ident(), signal.SIGHUP)
        with pytest.raises(Stop):
            ray_utils.init_ray()
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert fake_ray["shutdown"] and not os.path.exists(fake_ray["_temp_dir"])  # Ray and its /tmp folder gone


def test_non_ascii_run_folder_moves_the_session_to_tmp_and_says_so(fake_ray, tmp_path, capsys):
    """Ray encodes its session paths as ASCII ('ascii' codec can't encode ...): a short run folder
    with other characters gets its session under /tmp, named in one line, before Ray starts."""
    run_dir = tempfile.mkdtemp(prefix="r", dir="/tmp") + "/运行"
    assert len(run_dir.encode("utf-8")) <= ray_utils.MAX_TEMP_DIR_LEN  # short: it would have been used
    assert ray_utils.session_dir_for(run_dir) is None
    assert "non-ASCII" in ray_utils.ray_path_problem(run_dir)
    ray_utils.init_ray(temp_dir=run_dir)
    made = fake_ray["_temp_dir"]
    assert made.startswith("/tmp/msrl_ray_") and made.isascii()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and f"not under '{run_dir}'" in out and "non-ASCII" in out
    ray_utils.shutdown_ray()
    assert not os.path.exists(made)
    shutil.rmtree(os.path.dirname(run_dir), ignore_errors=True)


def test_a_killed_runs_session_folder_is_removed_by_the_next_run(fake_ray, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        for name in (f"msrl_ray_{dead.pid}_abc", f"msrl_ray_{live.pid}_live", "msrl_ray_old", "other_1_x"):
            (tmp_path / name).mkdir()
        assert ray_utils.remove_stale_temp_dirs(str(tmp_path)) == [str(tmp_path / f"msrl_ray_{dead.pid}_abc")]
        assert sorted(os.listdir(tmp_path)) == sorted([f"msrl_ray_{live.pid}_live", "msrl_ray_old", "other_1_x"])
    finally:
        live.terminate()  # the owner was only asked whether it runs: the first signal it gets is this one
        assert live.wait(timeout=60) == -signal.SIGTERM
    assert ray_utils.init_ray() is True  # a run's own folder names its pid
    assert os.path.basename(fake_ray["_temp_dir"]).startswith(f"msrl_ray_{os.getpid()}_")
    ray_utils.shutdown_ray()
