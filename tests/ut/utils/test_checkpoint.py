"""A checkpoint folder counts as complete only with DCP's metadata file and the trainer state."""
import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

from mindspeed_rl.utils.checkpoint import DCP_DIR, STATE, TRACKER, CheckpointError, is_checkpoint, resolve


def _save(root, iteration, metadata=True, state=True):
    """An iteration folder as a save writes it: a real DCP save plus the trainer state."""
    folder = os.path.join(root, f"iter_{iteration:07d}")
    dcp.save({"w": torch.arange(6.0).reshape(2, 3), "step": torch.tensor(iteration)},
             checkpoint_id=os.path.join(folder, DCP_DIR))
    if not metadata:  # a crash after the shards, before DCP's metadata
        os.remove(os.path.join(folder, DCP_DIR, ".metadata"))
    if state:
        with open(os.path.join(folder, STATE), "w") as f:
            json.dump({"iteration": iteration}, f)
    return folder


def _track(root, iteration):
    with open(os.path.join(root, TRACKER), "w") as f:
        f.write(f"{iteration}\n")


@pytest.fixture(autouse=True)
def _quiet():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp.save without a process group warns
        yield


def test_dcp_writes_the_metadata_file_the_check_looks_for(tmp_path):
    folder = _save(str(tmp_path), 2)
    assert os.path.isfile(os.path.join(folder, DCP_DIR, ".metadata"))
    assert any(n.endswith(".distcp") for n in os.listdir(os.path.join(folder, DCP_DIR)))
    _track(str(tmp_path), 2)
    assert is_checkpoint(str(tmp_path)) and is_checkpoint(folder)
    assert resolve(str(tmp_path)) == (os.path.join(str(tmp_path), "iter_0000002"), 2)
    assert resolve(folder) == (folder, 2)


def test_iteration_folder_without_dcp_metadata_is_incomplete(tmp_path):
    folder = _save(str(tmp_path), 4, metadata=False)
    assert os.listdir(os.path.join(folder, DCP_DIR))  # the shards are there
    with pytest.raises(CheckpointError, match=r"iter_0000004.*cannot be loaded: dcp/\.metadata is missing"):
        resolve(folder)


def test_tracker_naming_a_save_without_dcp_metadata_is_never_loaded(tmp_path):
    root = str(tmp_path)
    _save(root, 4, metadata=False)
    _track(root, 4)
    with pytest.raises(CheckpointError, match=r"iter_0000004.*cannot be loaded: dcp/\.metadata is missing"):
        resolve(root)
    # with an older complete save next to it: that one, or an error, but never the incomplete one
    _save(root, 2)
    try:
        folder, iteration = resolve(root)
    except CheckpointError as err:
        assert "iter_0000004" in str(err) and ".metadata" in str(err)
    else:
        assert (folder, iteration) == (os.path.join(root, "iter_0000002"), 2)


def test_folder_without_trainer_state_is_incomplete(tmp_path):
    folder = _save(str(tmp_path), 6, state=False)
    with pytest.raises(CheckpointError, match=rf"cannot be loaded: {STATE} is missing"):
        resolve(folder)
