"""init_ray / shutdown_ray: local sessions stay on loopback and leave no /tmp folders behind."""
import os
import shutil
import tempfile

import ray

from mindspeed_rl.utils import ray_utils


def test_local_session_folder_is_removed_at_shutdown(monkeypatch):
    calls = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.update(kw))
    monkeypatch.setattr(ray, "shutdown", lambda: calls.update(shutdown=True))
    assert ray_utils.init_ray() is True
    made = calls["_temp_dir"]
    assert calls["_node_ip_address"] == "127.0.0.1" and os.path.isdir(made)
    ray_utils.shutdown_ray()
    assert calls["shutdown"] and not os.path.exists(made)
    # a session folder inside the run folder is the run's own: kept
    run_dir = os.path.join(tempfile.mkdtemp(prefix="r"), "ray")  # short: Ray's socket paths need it
    ray_utils.init_ray(temp_dir=run_dir)
    ray_utils.shutdown_ray()
    assert os.path.isdir(run_dir)
    shutil.rmtree(os.path.dirname(run_dir))
