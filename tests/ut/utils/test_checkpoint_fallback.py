"""Which checkpoint a resume picks when the newest is damaged, what counts as damage, and that a
restore brings back every random stream a save captured (python, numpy, torch, the device's)."""
import json
import os
import random

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

from mindspeed_rl.utils import checkpoint as ckpt


@pytest.fixture(autouse=True)
def _quiet():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp.save without a process group warns
        yield


def _save(root, iteration, state=None):
    """An iteration folder as a save leaves it: a real DCP save and the trainer state."""
    folder = ckpt.iteration_dir(str(root), iteration)
    dcp.save({"w": torch.arange(64.0), "step": torch.tensor(iteration)},
             checkpoint_id=os.path.join(folder, ckpt.DCP_DIR))
    ckpt.write_state(folder, {"iteration": iteration, "kl_coef": 0.1} if state is None else state)
    return folder


def _shards(folder):
    dcp_dir = os.path.join(folder, ckpt.DCP_DIR)
    return [os.path.join(dcp_dir, n) for n in sorted(os.listdir(dcp_dir)) if n.endswith(".distcp")]


def _truncate(folder):
    shard = _shards(folder)[0]
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    return shard


def _root(tmp_path, iterations, tracker):
    for it in iterations:
        _save(tmp_path, it)
    ckpt.write_tracker(str(tmp_path), tracker)
    return str(tmp_path)


# ------------------------------------------------------------------ fallback choice


def test_fallback_picks_the_newest_intact_older_iteration(tmp_path, capsys):
    root = _root(tmp_path, [2, 4, 6, 8], tracker=8)
    _truncate(ckpt.iteration_dir(root, 8))
    _truncate(ckpt.iteration_dir(root, 6))
    assert ckpt.find(root) == (ckpt.iteration_dir(root, 4), 4)  # not 2, the oldest
    out = capsys.readouterr().out
    assert "iter_0000008" in out and "truncated" in out and "iteration 4" in out


def test_fallback_never_picks_an_iteration_newer_than_the_tracker(tmp_path):
    """A folder past the tracker (a save that never finished its tracker) is not a fallback."""
    root = _root(tmp_path, [3, 5, 9], tracker=5)
    _truncate(ckpt.iteration_dir(root, 5))
    assert ckpt.find(root) == (ckpt.iteration_dir(root, 3), 3)
    assert ckpt.find(ckpt.iteration_dir(root, 9)) == (ckpt.iteration_dir(root, 9), 9)


def test_the_fall_back_is_said_once_a_run(tmp_path, capsys):
    root = _root(tmp_path, [2, 4], tracker=4)
    os.remove(os.path.join(ckpt.iteration_dir(root, 4), ckpt.STATE))  # an unfinished save: the cheap check sees it
    assert ckpt.resolve(root) == (ckpt.iteration_dir(root, 2), 2)  # config time: silent
    assert capsys.readouterr().out == ""
    ckpt.find(root)  # the load says it
    assert capsys.readouterr().out.count("resuming from the previous intact iteration 2") == 1


def test_intact_newest_is_taken_without_a_warning(tmp_path, capsys):
    root = _root(tmp_path, [1, 2], tracker=2)
    assert ckpt.find(root) == (ckpt.iteration_dir(root, 2), 2)
    assert capsys.readouterr().out == ""


def test_no_intact_iteration_is_an_error_naming_the_tracked_one(tmp_path):
    root = _root(tmp_path, [1, 2], tracker=2)
    _truncate(ckpt.iteration_dir(root, 1))
    _truncate(ckpt.iteration_dir(root, 2))
    with pytest.raises(ckpt.CheckpointError, match=r"iter_0000002.* of iteration 2 .*no older intact iteration"):
        ckpt.find(root)


def test_cheap_check_only_asks_whether_the_save_finished(tmp_path):
    """resolve (config time) accepts a truncated shard that find (load time) rejects."""
    root = _root(tmp_path, [1, 2], tracker=2)
    _truncate(ckpt.iteration_dir(root, 2))
    assert ckpt.resolve(root) == (ckpt.iteration_dir(root, 2), 2)
    assert ckpt.find(root, deep=False) == (ckpt.iteration_dir(root, 2), 2)
    assert ckpt.find(root)[1] == 1


def test_weights_only_does_not_need_the_trainer_state(tmp_path):
    root = _root(tmp_path, [1, 2], tracker=2)
    with open(os.path.join(ckpt.iteration_dir(root, 2), ckpt.STATE), "w") as f:
        f.write("{not json")
    assert ckpt.find(root, weights_only=True) == (ckpt.iteration_dir(root, 2), 2)
    assert ckpt.find(root)[1] == 1


# ------------------------------------------------------------------ damage


def test_intact_folder_has_no_damage(tmp_path):
    assert ckpt.damage(_save(tmp_path, 1)) is None


def test_truncated_and_missing_shards_are_named(tmp_path):
    folder = _save(tmp_path, 1)
    shard = _shards(folder)[0]
    size = os.path.getsize(shard)
    _truncate(folder)
    assert ckpt.damage(folder) == f"shard {shard} is truncated ({size // 2} of {size} bytes)"
    os.remove(shard)
    assert ckpt.damage(folder) == f"shard {shard} is missing"
    assert ckpt.damage(folder, weights_only=True) == f"shard {shard} is missing"


def test_a_shard_one_byte_short_is_damage_and_extra_bytes_are_not(tmp_path):
    folder = _save(tmp_path, 1)
    shard = _shards(folder)[0]
    size = os.path.getsize(shard)
    with open(shard, "ab") as f:
        f.write(b"\0")
    assert ckpt.damage(folder) is None
    with open(shard, "r+b") as f:
        f.truncate(size - 1)
    assert ckpt.damage(folder) == f"shard {shard} is truncated ({size - 1} of {size} bytes)"


@pytest.mark.parametrize("text, problem", [
    ("{not json", "is not readable JSON (JSONDecodeError"),
    ('["a list"]', "holds no trainer state (no 'kl_coef')"),
    ('{"iteration": 1}', "holds no trainer state (no 'kl_coef')"),
])
def test_bad_trainer_state_is_damage_unless_weights_only(tmp_path, text, problem):
    folder = _save(tmp_path, 1)
    path = os.path.join(folder, ckpt.STATE)
    with open(path, "w") as f:
        f.write(text)
    assert ckpt.damage(folder).startswith(f"{path} {problem}")
    assert ckpt.damage(folder, weights_only=True) is None


def test_unreadable_dcp_metadata_is_damage(tmp_path):
    folder = _save(tmp_path, 1)
    with open(os.path.join(folder, ckpt.DCP_DIR, ".metadata"), "wb") as f:
        f.write(b"not a pickle")
    problem = ckpt.damage(folder, weights_only=True)
    assert problem.startswith(os.path.join(folder, ckpt.DCP_DIR, ".metadata") + " is not readable (")


def test_incomplete_names_the_first_missing_part(tmp_path):
    folder = _save(tmp_path, 1)
    assert ckpt.incomplete(folder) is None
    os.remove(os.path.join(folder, ckpt.STATE))
    assert ckpt.incomplete(folder) == f"{ckpt.STATE} is missing"
    os.remove(os.path.join(folder, ckpt.DCP_DIR, ".metadata"))
    assert ckpt.incomplete(folder) == os.path.join(ckpt.DCP_DIR, ".metadata") + " is missing"
    assert ckpt.incomplete(os.path.join(str(tmp_path), "iter_0000009")) == "the folder is missing"


# ------------------------------------------------------------------ naming a checkpoint


def test_tracker_and_iteration_folder_names(tmp_path):
    root = str(tmp_path)
    assert ckpt.iteration_dir(root, 12) == os.path.join(root, "iter_0000012")
    assert not ckpt.is_checkpoint(root)
    ckpt.write_tracker(root, 12)
    with open(os.path.join(root, ckpt.TRACKER)) as f:
        assert f.read() == "12\n"
    assert ckpt.is_checkpoint(root)
    assert ckpt.is_checkpoint(os.path.join(root, "iter_0000003") + os.sep)
    assert not ckpt.is_checkpoint(os.path.join(root, "iter_x"))
    assert not ckpt.is_checkpoint(os.path.join(root, "model_0000003"))
    assert not [n for n in os.listdir(root) if n != ckpt.TRACKER]  # the temporary tracker is renamed


def test_missing_folder_and_bad_tracker_are_errors(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.find(os.path.join(str(tmp_path), "nowhere"))
    with pytest.raises(ckpt.CheckpointError, match=f"has no {ckpt.TRACKER}"):
        ckpt.find(str(tmp_path))
    (tmp_path / ckpt.TRACKER).write_text(" 7 \n")
    _save(tmp_path, 7)
    assert ckpt.find(str(tmp_path)) == (ckpt.iteration_dir(str(tmp_path), 7), 7)
    (tmp_path / ckpt.TRACKER).write_text("seven")
    with pytest.raises(ckpt.CheckpointError, match="should hold an iteration number in ASCII digits, holds 'seven'"):
        ckpt.find(str(tmp_path))


def test_iterations_lists_only_iteration_folders(tmp_path):
    for name in ("iter_0000010", "iter_0000002", "iter_abc", "other", ".tmp-iter_0000003-h-1-ab"):
        (tmp_path / name).mkdir()
    assert ckpt._iterations(str(tmp_path)) == [2, 10]


def test_state_file_is_json_and_written_through_a_temporary(tmp_path):
    ckpt.write_state(str(tmp_path), {"kl_coef": 0.5, "iteration": 3})
    assert os.listdir(tmp_path) == [ckpt.STATE]
    with open(tmp_path / ckpt.STATE) as f:
        assert json.load(f) == {"kl_coef": 0.5, "iteration": 3}


# ------------------------------------------------------------------ random streams


def _draw():
    return (random.random(), float(np.random.rand()), float(torch.rand(1)))


def test_restore_brings_back_python_numpy_and_torch_streams():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = ckpt.capture_rng(torch.device("cpu"))
    assert set(saved) == {"cpu", "python", "numpy"}
    expected = _draw()
    random.seed(10), np.random.seed(20), torch.manual_seed(30)
    assert _draw() != expected
    ckpt.restore_rng(saved, torch.device("cpu"))
    assert _draw() == expected


@pytest.mark.parametrize("stream", [0, 1, 2])
def test_each_stream_is_restored_on_its_own(stream):
    """Only one stream moved since the save: the restore must bring that one back."""
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = ckpt.capture_rng(torch.device("cpu"))
    expected = _draw()
    [random.random, np.random.rand, torch.rand][stream](*([] if stream < 2 else [5]))
    ckpt.restore_rng(saved, torch.device("cpu"))
    assert _draw() == expected


def test_a_state_without_python_and_numpy_restores_torch_only():
    """Checkpoints written before the python and numpy streams were saved still load."""
    torch.manual_seed(3)
    saved = {"cpu": torch.get_rng_state()}
    expected = float(torch.rand(1))
    random.seed(5)
    py = random.random()
    ckpt.restore_rng(saved, torch.device("cpu"))
    assert float(torch.rand(1)) == expected
    random.seed(5)
    assert random.random() == py


class _FakeAccelerator:
    """torch.<device type> as far as the RNG goes."""

    def __init__(self):
        self.state, self.calls = torch.tensor([1, 2, 3], dtype=torch.uint8), []

    def get_rng_state(self, device):
        self.calls.append(("get", device))
        return self.state.clone()

    def set_rng_state(self, state, device):
        self.calls.append(("set", device))
        self.state = state.clone()


def test_the_device_stream_is_captured_and_restored(monkeypatch):
    fake = _FakeAccelerator()
    monkeypatch.setattr(torch, "cuda", fake)
    device = torch.device("cuda", 1)
    assert ckpt._accelerator(device) is fake and ckpt._accelerator(torch.device("cpu")) is None
    saved = ckpt.capture_rng(device)
    assert set(saved) == {"cpu", "python", "numpy", "cuda"} and saved["cuda"].tolist() == [1, 2, 3]
    fake.state = torch.tensor([9], dtype=torch.uint8)
    ckpt.restore_rng(saved, device)
    assert fake.state.tolist() == [1, 2, 3] and fake.calls == [("get", device), ("set", device)]
    # a state saved on CPU restores on the device without touching the device stream
    ckpt.restore_rng({k: v for k, v in saved.items() if k != "cuda"}, device)
    assert fake.calls[-1] == ("set", device) and len(fake.calls) == 2


def test_a_device_type_torch_has_no_module_for_is_left_alone():
    assert ckpt._accelerator(torch.device("meta")) is None
    assert set(ckpt.capture_rng(torch.device("meta"))) == {"cpu", "python", "numpy"}
