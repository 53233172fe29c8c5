"""Checkpoint files and folders: temporaries live beside their target (atomic renames) under names the
cleanup can parse, stale partial saves of dead processes are removed and nothing else, iteration
numbers of any width, and what restore passes to the workers and prints."""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from mindspeed_rl.utils import checkpoint as ckpt


def _workers(seen=None):
    def save(folder):
        if seen is not None:
            seen.append(folder)
        os.makedirs(os.path.join(folder, ckpt.DCP_DIR))
        open(os.path.join(folder, ckpt.DCP_DIR, ".metadata"), "wb").close()
    return save


@pytest.fixture
def renames(monkeypatch):
    """Every os.replace (src, dst) made while the fixture is active."""
    seen = []
    real = os.replace

    def replace(src, dst):
        seen.append((str(src), str(dst)))
        real(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    return seen


def test_tracker_and_state_are_renamed_from_a_temporary_beside_them(tmp_path, monkeypatch, renames):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    root = tmp_path / "save"
    root.mkdir()
    ckpt.write_tracker(str(root), 3)
    ckpt.write_state(str(root), {"kl_coef": 0.5})
    assert [(os.path.dirname(s), d) for s, d in renames] == [
        (str(root), os.path.join(str(root), ckpt.TRACKER)), (str(root), os.path.join(str(root), ckpt.STATE))]
    assert os.listdir(elsewhere) == []


def test_save_works_in_a_temporary_folder_of_the_root_and_renames_within_it(tmp_path, monkeypatch, renames):
    monkeypatch.chdir(tmp_path)
    root = str(tmp_path / "save")
    seen = []
    ckpt.Checkpointer(root, _workers(seen)).save(2, {"kl_coef": 0.1})
    ckpt.Checkpointer(root, _workers(seen)).save(2, {"kl_coef": 0.2})  # replaces the folder of iteration 2
    host = socket.gethostname().replace("-", "_")
    for folder in seen:
        assert os.path.dirname(folder) == root
        assert re.fullmatch(rf"\.tmp-iter_0000002-{re.escape(host)}-{os.getpid()}-[0-9a-f]{{8}}",
                            os.path.basename(folder)), folder
    assert all(s.startswith(root + os.sep) and d.startswith(root + os.sep) for s, d in renames), renames
    old = [s for s, d in renames if os.path.basename(d).startswith(".old-")]
    assert len(old) == 1 and re.fullmatch(rf"\.old-iter_0000002-{re.escape(host)}-{os.getpid()}-[0-9a-f]{{8}}",
                                          os.path.basename([d for s, d in renames if s in old][0]))
    # the replaced folder is gone, nothing temporary is left
    assert sorted(os.listdir(root)) == ["iter_0000002", ckpt.TRACKER]
    with open(os.path.join(ckpt.iteration_dir(root, 2), ckpt.STATE), encoding="utf-8") as f:
        assert json.load(f)["kl_coef"] == 0.2


def test_hostname_dashes_become_underscores_in_temporary_names(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "node-a-1")
    seen = []
    ckpt.Checkpointer(str(tmp_path), _workers(seen)).save(1, {})
    assert os.path.basename(seen[0]).startswith(f".tmp-iter_0000001-node_a_1-{os.getpid()}-")
    assert len(os.path.basename(seen[0]).split("-")) == 5  # what the cleanup splits on


def _dead_pid():
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(out.stdout)


def test_stale_partial_saves_of_this_host_are_removed_and_nothing_else(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(socket, "gethostname", lambda: "node-a")
    dead = _dead_pid()
    names = {
        "stale_tmp": f".tmp-iter_0000002-node_a-{dead}-abcd1234",
        "stale_old": f".old-iter_0000004-node_a-{dead}-abcd1234",
        "sorted_first": f".a-iter_0000002-node_a-{dead}-abcd1234",    # not a save's temporary
        "other_shape": f"x-y-node_a-{dead}-abcd1234",                  # five parts, but no save prefix
        "six_parts": f".tmp-iter_0000002-node_a-{dead}-abcd1234-x",
        "no_pid": ".tmp-iter_0000002-node_a-pid-abcd1234",
        "other_host": f".tmp-iter_0000002-node_b-{dead}-abcd1234",
        "live": f".tmp-iter_0000002-node_a-{os.getpid()}-abcd1234",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
    removed = ckpt.remove_stale_partial_saves(str(tmp_path))
    assert removed == [names["stale_old"], names["stale_tmp"]]
    assert sorted(os.listdir(tmp_path)) == sorted(v for k, v in names.items() if not k.startswith("stale"))
    out = capsys.readouterr().out
    for key in ("stale_old", "stale_tmp"):
        assert f"removed a partial save left by a stopped run: {tmp_path / names[key]}\n" in out


def test_liveness_probe_sends_no_signal(tmp_path, monkeypatch):
    """A live process's folder is kept, and the process is not disturbed by the probe."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    try:
        name = f".tmp-iter_0000001-node-{child.pid}-abcd1234"
        (tmp_path / name).mkdir()
        assert ckpt.remove_stale_partial_saves(str(tmp_path)) == []
        assert child.poll() is None and os.listdir(tmp_path) == [name]
    finally:
        child.kill()
        child.wait()


def test_a_process_we_may_not_signal_counts_as_alive(monkeypatch):
    def kill(pid, sig):
        raise PermissionError
    monkeypatch.setattr(os, "kill", kill)
    assert ckpt.pid_alive(12345) is True


def test_a_gone_process_is_not_alive():
    assert ckpt.pid_alive(_dead_pid()) is False and ckpt.pid_alive(os.getpid()) is True


def test_seven_digit_iterations(tmp_path):
    """iter_XXXXXXX pads to 7 digits; a 7-digit iteration has no leading zero to spare."""
    root = str(tmp_path)
    for it in (999999, 1234567):
        _workers()(ckpt.iteration_dir(root, it))
        ckpt.write_state(ckpt.iteration_dir(root, it), {"kl_coef": 0.1})
    ckpt.write_tracker(root, 1234567)
    assert ckpt._iterations(root) == [999999, 1234567]
    assert ckpt.resolve(root) == (ckpt.iteration_dir(root, 1234567), 1234567)
    assert ckpt.resolve(ckpt.iteration_dir(root, 1234567)) == (ckpt.iteration_dir(root, 1234567), 1234567)


def test_which_names_are_checkpoints(tmp_path):
    assert ckpt.is_checkpoint(str(tmp_path / "iter_1"))
    assert not ckpt.is_checkpoint(str(tmp_path / "model1234"))
    assert not ckpt.is_checkpoint(str(tmp_path / "iter_abc"))
    (tmp_path / "iter_abc").mkdir()
    with pytest.raises(ckpt.CheckpointError, match="has no latest_checkpointed_iteration.txt"):
        ckpt.find(str(tmp_path / "iter_abc"))


class _Loads:
    def __init__(self):
        self.calls = []

    def __call__(self, folder, iteration, with_optimizer, with_rng):
        self.calls.append((folder, iteration, with_optimizer, with_rng))


def test_restore_loads_optimizer_and_rng_by_default_and_says_so(tmp_path, capsys):
    folder = ckpt.iteration_dir(str(tmp_path), 6)
    os.makedirs(folder)
    saved = {"kl_coef": 0.3, "data_position": 8, "dock_round": 5}
    loads = _Loads()
    state = ckpt.Checkpointer(str(tmp_path), load_workers=loads).restore(
        ckpt.Resume(folder, 6, state=ckpt.driver_state(6, saved)))
    assert loads.calls == [(folder, 6, True, True)]
    assert state == {"iteration": 6, "kl_coef": 0.3, "data_position": 8}
    assert capsys.readouterr().out == (f"resumed from {folder} at iteration 6: restored weights, optimizer state, "
                                       "RNG state, KL coefficient and data position\n")
    ckpt.Checkpointer(str(tmp_path), load_workers=loads).restore(
        ckpt.Resume(folder, 6, finetune=True, with_optimizer=False, with_rng=False))
    assert capsys.readouterr().out == (f"loaded the weights of {folder} (iteration 6) and started at iteration 0; "
                                       "left behind (megatron_training.finetune: true): optimizer state, RNG state, "
                                       "iteration, KL coefficient and data position\n")
