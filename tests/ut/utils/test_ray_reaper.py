"""ray_reaper: what is left of a local Ray session is ended once its driver dies or is done."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from mindspeed_rl.utils import ray_reaper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _sleeper(*args, ray_dir=None, **kwargs):
    """A process that sleeps: a plain Python one, or (``ray_dir``) a program of that Ray package folder."""
    program = [os.path.join(ray_dir, "sleeper.py")] if ray_dir else ["-c", "import time; time.sleep(300)"]
    return subprocess.Popen([sys.executable, *program, *args], **kwargs)


@LINUX
def test_session_processes_are_ray_processes_holding_its_files_or_naming_it(tmp_path):
    session, ray_dir = tmp_path / "session_1", tmp_path / "ray"
    (session / "logs").mkdir(parents=True)
    ray_dir.mkdir()
    (ray_dir / "sleeper.py").write_text("import time\ntime.sleep(300)\n")
    with open(session / "logs" / "agent.out", "w") as log:
        holder = _sleeper(ray_dir=str(ray_dir), stdout=log)  # like Ray's monitors: stdout in the session's logs
        not_ray = _sleeper(stdout=log)  # a process of the user's that happens to hold a session file
        titled = subprocess.Popen(["ray::Agent", "300"], executable=shutil.which("sleep"),  # like the node agents
                                  stdout=log)
    naming = _sleeper(f"--log-dir={session}/logs", ray_dir=str(ray_dir))  # like the GCS: the folder in its args
    other = _sleeper(f"--log-dir={session}_2/logs", ray_dir=str(ray_dir))  # a folder that only starts the same
    procs = (holder, not_ray, titled, naming, other)
    mine = sorted([holder.pid, titled.pid, naming.pid])
    try:
        for proc in procs:  # Popen returns a moment before the exec shows the new arguments in /proc
            for _ in range(6000):
                with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                    if f.read():
                        break
                time.sleep(0.01)
        assert sorted(ray_reaper.session_processes(str(session), str(ray_dir))) == mine
        # a driver that still runs keeps itself and its forks
        assert ray_reaper.session_processes(str(session), str(ray_dir), keep_family_of=os.getpid()) == []
        assert ray_reaper.session_processes(str(session), str(ray_dir), skip={holder.pid, naming.pid}) == [titled.pid]
        assert sorted(ray_reaper.sweep(str(session), str(ray_dir))) == mine
        assert all(p.wait(timeout=60) == -signal.SIGKILL for p in (holder, titled, naming))
        assert not_ray.poll() is None and other.poll() is None
        # a dead process that its parent has not waited for (a zombie) is not found
        zombie = _sleeper(f"--log-dir={session}/logs", ray_dir=str(ray_dir))
        os.kill(zombie.pid, signal.SIGKILL)
        for _ in range(6000):  # bounded: a killed child turns zombie at once
            if ray_reaper._stat(str(zombie.pid))[0] == "Z":
                break
            time.sleep(0.01)
        assert ray_reaper._stat(str(zombie.pid))[0] == "Z"
        assert ray_reaper.session_processes(str(session), str(ray_dir)) == []
        zombie.wait(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=60)


@LINUX
def test_the_reaper_waits_for_a_line_or_the_drivers_death():
    read, write = os.pipe()
    driver = _sleeper()
    try:
        os.write(write, b"done\n")
        assert ray_reaper.wait_for_driver(driver.pid, read) == "done"
    finally:
        os.close(read)
        os.close(write)
    read, write = os.pipe()
    try:
        threading.Timer(0.5, driver.kill).start()
        assert ray_reaper.wait_for_driver(driver.pid, read) == "died"  # nothing on the pipe
        driver.wait(timeout=60)
        assert ray_reaper.wait_for_driver(driver.pid, read) == "died"  # gone before it was watched
    finally:
        os.close(read)
        os.close(write)


# The driver: a local Ray with one actor; it prints its session folder and /tmp folder, then waits to be killed.
DRIVER = """
import os, sys, time
import ray
from mindspeed_rl.utils import ray_utils
ray_utils.init_ray(num_cpus=1)
@ray.remote(num_cpus=0.5)
class Actor:
    def ready(self):
        return True
actor = Actor.remote()
ray.get(actor.ready.remote())
print("SESSION", ray._private.worker._global_node.get_session_dir_path(), ray_utils._OWN_TEMP_DIRS[0], flush=True)
time.sleep(600)
"""

# Runs the driver as a child subreaper: the processes orphaned by its death become this process's children,
# so their exit statuses can be read (killed by the reaper: SIGKILL; Ray's agents ending by themselves: 0).
WATCHER = """
import ctypes, importlib.util, json, os, signal, subprocess, sys, time
from mindspeed_rl.utils.ray_reaper import session_processes
RAY = os.path.dirname(importlib.util.find_spec("ray").origin)
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
driver = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
# the driver's own line (a slow start may print Ray's notices first)
session, temp = next(line for line in driver.stdout if line.startswith("SESSION ")).split()[1:]
names = {}
for pid in session_processes(session, RAY, skip={os.getpid()}):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        names[pid] = f.read().split(b"\\0")[0].decode()
os.kill(driver.pid, signal.SIGKILL)
statuses, deadline = {}, time.monotonic() + 300
while time.monotonic() < deadline:
    try:
        pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:  # every descendant has ended
        break
    if pid:
        statuses[pid] = status
    else:
        time.sleep(0.05)
ended = {names[p]: (os.WTERMSIG(s) if os.WIFSIGNALED(s) else -os.WEXITSTATUS(s)) for p, s in statuses.items()
         if p in names}
print(json.dumps(dict(ended=ended, left=session_processes(session, RAY), temp=os.path.exists(temp))))
"""


@LINUX
def test_a_killed_drivers_ray_processes_are_ended_and_its_tmp_folder_removed():
    """Ray's DashboardAgent and RuntimeEnvAgent outlive a SIGKILLed driver by about a minute (they wait on the
    GCS that died with it); the reaper ends them at once: killed, not exited on their own."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", WATCHER, DRIVER], capture_output=True, text=True, timeout=600,
                         env=env, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    ended = report["ended"]
    assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= set(ended), ended
    assert ended["ray::DashboardAgent"] == ended["ray::RuntimeEnvAgent"] == signal.SIGKILL
    assert report["left"] == [] and report["temp"] is False
