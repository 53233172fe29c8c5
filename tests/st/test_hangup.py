"""A terminal that closes sends SIGHUP to the run's whole process group, Ray's processes included: the run ends
in its own line and leaves no process of its Ray session (before: the GCS died first and the run ended a
minute later with Ray's 'Failed to connect to GCS within 60 seconds')."""
import glob
import importlib.util
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
from mindspeed_rl.utils.ray_reaper import session_processes  # noqa: E402

RAY = os.path.dirname(importlib.util.find_spec("ray").origin)

BOUND_S = 600  # bounds only: a wrong result fails, it never hangs


def _wait_for(predicate, what):
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"no {what} within {BOUND_S}s")


def test_sighup_to_the_process_group_ends_the_run_in_its_own_line(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)  # the run starts its own local Ray
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        run = subprocess.Popen([sys.executable, os.path.join(ROOT, "cli", "train_grpo.py"), "--config",
                                os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml"), "--output-dir", str(out),
                                "--tiny-model-dir", str(tmp_path / "model"), "megatron_training.train_iters=50"],
                               stdout=stdout, stderr=stderr, env=env, start_new_session=True)  # as under setsid
    try:
        _wait_for(lambda: "iter 1:" in (tmp_path / "stdout").read_text() or run.poll() is not None, "iteration 1")
        assert run.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        # under the run folder, or under /tmp when that path is too long for Ray's sockets
        sessions = glob.glob(str(out / "ray" / "session_2*")) + glob.glob(f"/tmp/msrl_ray_{run.pid}_*/session_2*")
        assert len(sessions) == 1 and len(session_processes(sessions[0], RAY)) > 3  # Ray is up
        os.killpg(run.pid, signal.SIGHUP)  # the terminal closed: the whole group, Ray's processes included
        code = run.wait(timeout=BOUND_S)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(timeout=BOUND_S)
    err = (tmp_path / "stderr").read_text()
    assert code == 128 + signal.SIGHUP, err[-3000:]
    assert err.strip().splitlines()[-1] == "error: stopped by SIGHUP; Ray was shut down"
    assert "Failed to connect to GCS" not in err
    assert session_processes(sessions[0], RAY) == []  # nothing of the run's Ray session is left (zombies aside)
    assert not glob.glob(f"/tmp/msrl_ray_{run.pid}_*")
