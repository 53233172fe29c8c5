"""Checkpointer: a save never writes into a folder the tracker names or into a complete one."""
import os

import pytest

from mindspeed_rl.utils import checkpoint as ckpt


def _workers(payload: bytes, fail_after_write: bool = False):
    """Stands in for the worker group: writes a DCP-like folder (shards + .metadata)."""
    def save(folder):
        os.makedirs(os.path.join(folder, ckpt.DCP_DIR))
        with open(os.path.join(folder, ckpt.DCP_DIR, "__0_0.distcp"), "wb") as f:
            f.write(payload)
        if fail_after_write:
            raise RuntimeError("worker died mid-save")
        open(os.path.join(folder, ckpt.DCP_DIR, ".metadata"), "wb").close()
    return save


def _shard(root, iteration):
    with open(os.path.join(ckpt.iteration_dir(str(root), iteration), ckpt.DCP_DIR, "__0_0.distcp"), "rb") as f:
        return f.read()


def test_save_writes_state_and_tracker_and_leaves_no_temporary_folder(tmp_path):
    folder = ckpt.Checkpointer(str(tmp_path), _workers(b"a")).save(3, {"kl_coef": 0.5})
    assert folder == ckpt.iteration_dir(str(tmp_path), 3)
    assert ckpt.resolve(str(tmp_path)) == (folder, 3)
    assert ckpt.read_state(folder) == {"kl_coef": 0.5, "iteration": 3}
    assert sorted(os.listdir(tmp_path)) == ["iter_0000003", ckpt.TRACKER]


def test_failed_save_keeps_the_complete_checkpoint_of_that_iteration(tmp_path):
    """Resumed from an older iteration and saving into the same root: the old
    folder of that iteration is untouched until the new one is complete."""
    ckpt.Checkpointer(str(tmp_path), _workers(b"old")).save(2, {"kl_coef": 0.1})
    ckpt.Checkpointer(str(tmp_path), _workers(b"newer")).save(5, {"kl_coef": 0.2})
    with pytest.raises(RuntimeError, match="mid-save"):
        ckpt.Checkpointer(str(tmp_path), _workers(b"new", fail_after_write=True)).save(2, {"kl_coef": 0.3})
    assert _shard(tmp_path, 2) == b"old" and ckpt.read_state(ckpt.iteration_dir(str(tmp_path), 2))["kl_coef"] == 0.1
    assert ckpt.resolve(str(tmp_path))[1] == 5  # the tracker still names the newest complete save
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # the temporary folder is gone
    # a save that completes replaces the older folder of the same iteration whole
    ckpt.Checkpointer(str(tmp_path), _workers(b"new")).save(2, {"kl_coef": 0.3})
    assert _shard(tmp_path, 2) == b"new" and ckpt.read_state(ckpt.iteration_dir(str(tmp_path), 2))["kl_coef"] == 0.3
    assert ckpt.resolve(str(tmp_path))[1] == 2


def test_resume_skips_an_incomplete_latest_iteration_and_says_so(tmp_path, capsys):
    ckpt.Checkpointer(str(tmp_path), _workers(b"a")).save(1, {})
    ckpt.Checkpointer(str(tmp_path), _workers(b"b")).save(2, {})
    os.remove(os.path.join(ckpt.iteration_dir(str(tmp_path), 2), ckpt.DCP_DIR, ".metadata"))
    folder, iteration = ckpt.resolve(str(tmp_path))
    assert iteration == 1 and folder == ckpt.iteration_dir(str(tmp_path), 1)
    assert capsys.readouterr().out == ""  # config time is silent: the load that follows says it, once
    assert ckpt.find(str(tmp_path), deep=False) == (folder, 1)
    assert "iter_0000002" in capsys.readouterr().out
    # an iteration folder named directly has no fallback
    with pytest.raises(ckpt.CheckpointError, match=r"\.metadata is missing"):
        ckpt.resolve(ckpt.iteration_dir(str(tmp_path), 2))


def test_unreadable_tracker_and_state_name_the_file(tmp_path):
    ckpt.Checkpointer(str(tmp_path), _workers(b"a")).save(1, {})
    (tmp_path / ckpt.TRACKER).write_bytes(b"\xe9\xff")
    with pytest.raises(ckpt.CheckpointError, match=ckpt.TRACKER):
        ckpt.resolve(str(tmp_path))
    state = os.path.join(ckpt.iteration_dir(str(tmp_path), 1), ckpt.STATE)
    open(state, "w").close()
    with pytest.raises(ckpt.CheckpointError, match="trainer_state.json"):
        ckpt.read_state(ckpt.iteration_dir(str(tmp_path), 1))


def test_partial_saves_of_a_stopped_run_are_removed_live_ones_kept(tmp_path, capsys):
    """A driver killed mid-save leaves .tmp-iter_*; the next save removes it when its process is gone."""
    import socket
    import subprocess
    import sys
    host = socket.gethostname().replace("-", "_")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".tmp-iter_0000002-{host}-{dead_pid}-abcd1234"
    live = tmp_path / f".tmp-iter_0000002-{host}-{os.getpid()}-abcd1234"
    other_host = tmp_path / f".tmp-iter_0000002-elsewhere-{dead_pid}-abcd1234"
    for folder in (stale, live, other_host):
        (folder / ckpt.DCP_DIR).mkdir(parents=True)
    ckpt.Checkpointer(str(tmp_path), _workers(b"a")).save(3, {})
    left = sorted(os.listdir(tmp_path))
    assert stale.name not in left and live.name in left and other_host.name in left
    assert stale.name in capsys.readouterr().out
