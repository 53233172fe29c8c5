"""What a load refuses and how it says so: the whole message of each refusal (the file and the key to
change), open_resume's check of the parts a resume asks for, and state left alone by a refused load."""
import builtins
import json
import os
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from mindspeed_rl.utils import checkpoint as ckpt


def _save(root, iteration, optimizer=True, ranks=(0,), state=None):
    """An iteration folder as a save of ours leaves it: DCP (with or without optimizer state), one RNG
    file per rank, the trainer state, and the tracker naming it."""
    folder = ckpt.iteration_dir(str(root), iteration)
    parts = {"model": {"w": torch.arange(8.0)}}
    if optimizer:
        parts["optim"] = {"state": {"w": {"exp_avg": torch.ones(8)}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp.save without a process group warns
        dcp.save(parts, checkpoint_id=os.path.join(folder, ckpt.DCP_DIR))
    os.makedirs(os.path.join(folder, "rng"))
    for rank in ranks:
        torch.save({"cpu": torch.get_rng_state()}, os.path.join(folder, "rng", f"rank{rank}.pt"))
    ckpt.write_state(folder, {"iteration": iteration, "kl_coef": 0.2, "data_position": iteration}
                     if state is None else state)
    ckpt.write_tracker(str(root), iteration)
    return folder


# ------------------------------------------------------------------ the tracker


def test_a_long_bad_tracker_is_quoted_to_its_first_40_characters(tmp_path):
    text = "abcdefghij" * 5  # 50 characters
    (tmp_path / ckpt.TRACKER).write_text(text + "\n")
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.find(str(tmp_path))
    assert str(info.value) == (f"checkpoint tracker {tmp_path / ckpt.TRACKER} should hold an iteration number in "
                               f"ASCII digits, holds {text[:40]!r}")


def test_a_tracker_that_cannot_be_read_is_named_with_the_os_reason(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    tracker = str(tmp_path / ckpt.TRACKER)
    real_open = builtins.open

    def failing_open(path, *args, **kwargs):
        if str(path) == tracker:
            raise OSError(5, "Input/output error")
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", failing_open)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.find(str(tmp_path))
    assert str(info.value) == f"checkpoint tracker {tracker} cannot be read: Input/output error"


def test_a_tracker_error_without_an_os_reason_names_the_error(tmp_path, monkeypatch):
    _save(tmp_path, 1)
    tracker = str(tmp_path / ckpt.TRACKER)
    real_open = builtins.open

    def failing_open(path, *args, **kwargs):
        if str(path) == tracker:
            raise OSError("the disk went away")  # no errno, no strerror
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", failing_open)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.find(str(tmp_path))
    assert str(info.value) == f"checkpoint tracker {tracker} cannot be read: the disk went away"


# ------------------------------------------------------------------ the trainer state


def test_a_state_file_that_is_not_json_is_named_with_the_parser_message_on_one_line(tmp_path):
    path = tmp_path / ckpt.STATE
    path.write_text("{\n  not json")
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.read_state(str(tmp_path))
    try:
        json.loads("{\n  not json")
    except ValueError as err:
        reason = " ".join(str(err).split())
    assert str(info.value) == f"{path} is not readable JSON (JSONDecodeError: {reason})"


def test_a_missing_state_file_is_named_and_the_reason_cut_to_120_characters(tmp_path):
    folder = tmp_path / ("x" * 150)  # the OS error repeats the long path: the reason is cut
    folder.mkdir()
    path = folder / ckpt.STATE
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.read_state(str(folder))
    reason = f"[Errno 2] No such file or directory: {str(path)!r}"
    assert len(reason) > 120
    assert str(info.value) == f"{path} is not readable JSON (FileNotFoundError: {reason[:120]})"


def test_a_json_list_is_no_trainer_state_even_when_it_holds_the_key_name(tmp_path):
    path = tmp_path / ckpt.STATE
    path.write_text('["kl_coef"]')
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.read_state(str(tmp_path))
    assert str(info.value) == f"{path} holds no trainer state (no 'kl_coef')"


# ------------------------------------------------------------------ open_resume checks what a resume asks for


def test_open_resume_checks_the_rng_files_for_the_run_world_size(tmp_path):
    folder = _save(tmp_path, 2, ranks=(0,))
    with pytest.raises(ckpt.CheckpointError, match=r"holds RNG state for 1 rank\(s\), this run has 3 \(no state "
                                                   r"for ranks 1, 2\); set megatron_training.no_load_rng: true"):
        ckpt.open_resume(str(tmp_path), world_size=3)
    # without RNG state asked for, the same checkpoint resumes on 3 ranks
    resume = ckpt.open_resume(str(tmp_path), no_load_rng=True, world_size=3)
    assert resume == ckpt.Resume(folder, 2, with_optimizer=True, with_rng=False,
                                 state={"iteration": 2, "kl_coef": 0.2, "data_position": 2})
    assert ckpt.open_resume(str(tmp_path), world_size=1).with_rng


def test_open_resume_checks_the_optimizer_state_unless_no_load_optim(tmp_path):
    folder = _save(tmp_path, 3, optimizer=False)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.open_resume(str(tmp_path), world_size=1)
    assert str(info.value) == (f"checkpoint {folder!r} holds no optimizer state (saved with no_save_optim: true?); "
                               f"set megatron_training.no_load_optim: true to resume with a fresh optimizer")
    resume = ckpt.open_resume(str(tmp_path), no_load_optim=True, world_size=1)
    assert (resume.folder, resume.with_optimizer, resume.with_rng) == (folder, False, True)


def test_a_finetune_needs_neither_optimizer_nor_rng_files(tmp_path):
    folder = _save(tmp_path, 4, optimizer=False, ranks=())
    resume = ckpt.open_resume(str(tmp_path), finetune=True, world_size=4)
    assert resume == ckpt.Resume(folder, 4, finetune=True, with_optimizer=False, with_rng=False)
    assert resume.state == {"iteration": 0, "data_position": 0}


def test_without_a_world_size_open_resume_leaves_the_parts_to_the_workers(tmp_path):
    folder = _save(tmp_path, 5, optimizer=False, ranks=())
    resume = ckpt.open_resume(str(tmp_path))
    assert (resume.folder, resume.iteration, resume.with_optimizer, resume.with_rng) == (folder, 5, True, True)


def test_unreadable_metadata_when_checking_the_optimizer_is_named(tmp_path):
    folder = _save(tmp_path, 1)
    metadata = os.path.join(folder, ckpt.DCP_DIR, ".metadata")
    with open(metadata, "wb") as f:
        f.write(b"not a pickle")
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.check_resumable(folder, with_optimizer=True, with_rng=False, world_size=1)
    assert str(info.value).startswith(f"{metadata} is not readable (") and str(info.value).endswith(")")
    ckpt.check_resumable(folder, with_optimizer=False, with_rng=True, world_size=1)  # not read without it


def test_rng_files_are_counted_by_their_pt_names(tmp_path):
    folder = _save(tmp_path, 1, ranks=(0, 1))
    open(os.path.join(folder, "rng", "rank2.tmp"), "wb").close()  # not a .pt file
    ckpt.check_resumable(folder, with_optimizer=True, with_rng=True, world_size=2)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.check_resumable(folder, with_optimizer=True, with_rng=True, world_size=4)
    assert str(info.value) == (f"checkpoint {folder!r} holds RNG state for 2 rank(s), this run has 4 (no state for "
                               f"ranks 2, 3); set megatron_training.no_load_rng: true to resume with fresh random "
                               f"streams")


def test_a_checkpoint_without_an_rng_folder_has_state_for_no_rank(tmp_path):
    folder = _save(tmp_path, 1, ranks=())
    os.rmdir(os.path.join(folder, "rng"))
    with pytest.raises(ckpt.CheckpointError, match=r"holds RNG state for 0 rank\(s\), this run has 1 \(no state "
                                                   r"for rank 0\)"):
        ckpt.check_resumable(folder, with_optimizer=False, with_rng=True, world_size=1)


# ------------------------------------------------------------------ damage across several shard files


def _save_in_shards(root):
    """One iteration folder whose DCP save spreads three tensors over three shard files."""
    folder = ckpt.iteration_dir(str(root), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"a": torch.ones(100), "b": torch.ones(50), "c": torch.ones(10)},
                 storage_writer=dcp.FileSystemWriter(os.path.join(folder, ckpt.DCP_DIR), thread_count=3))
    ckpt.write_state(folder, {"kl_coef": 0.1})
    return folder


def test_with_several_shards_missing_the_first_by_name_is_named(tmp_path):
    folder = _save_in_shards(tmp_path)
    dcp_dir = os.path.join(folder, ckpt.DCP_DIR)
    shards = sorted(n for n in os.listdir(dcp_dir) if n.endswith(".distcp"))
    assert len(shards) == 3
    for name in shards:
        os.remove(os.path.join(dcp_dir, name))
    # DCP's metadata need not list the files by name (b, c, a in torch 2.x): the first by name is named
    assert ckpt.damage(folder) == f"shard {os.path.join(dcp_dir, shards[0])} is missing"


def test_every_shard_file_is_checked_not_only_the_first(tmp_path):
    folder = _save_in_shards(tmp_path)
    dcp_dir = os.path.join(folder, ckpt.DCP_DIR)
    last = os.path.join(dcp_dir, sorted(n for n in os.listdir(dcp_dir) if n.endswith(".distcp"))[-1])
    size = os.path.getsize(last)
    with open(last, "r+b") as f:
        f.truncate(size - 1)
    assert ckpt.damage(folder) == f"shard {last} is truncated ({size - 1} of {size} bytes)"


# ------------------------------------------------------------------ what damage() names first


def test_damage_of_an_unfinished_save_names_the_missing_part_not_a_read_error(tmp_path):
    folder = _save(tmp_path, 1)
    os.remove(os.path.join(folder, ckpt.STATE))
    assert ckpt.damage(folder) == f"{ckpt.STATE} is missing"
    assert ckpt.damage(folder, weights_only=True) == f"{ckpt.STATE} is missing"  # the save did not finish
    os.remove(os.path.join(folder, ckpt.DCP_DIR, ".metadata"))
    assert ckpt.damage(folder) == os.path.join(ckpt.DCP_DIR, ".metadata") + " is missing"
    assert ckpt.damage(os.path.join(str(tmp_path), "iter_0000009")) == "the folder is missing"


def test_unreadable_metadata_names_the_readers_error(tmp_path):
    folder = _save(tmp_path, 1)
    metadata = os.path.join(folder, ckpt.DCP_DIR, ".metadata")
    with open(metadata, "wb") as f:
        f.write(b"not a pickle")
    try:
        dcp.FileSystemReader(os.path.join(folder, ckpt.DCP_DIR)).read_metadata()
    except Exception as err:  # noqa: BLE001  (whatever the reader raises is what the message names)
        kind = type(err).__name__
    assert ckpt.damage(folder) == f"{metadata} is not readable ({kind})"
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.check_resumable(folder, with_optimizer=True, with_rng=False, world_size=1)
    assert str(info.value) == f"{metadata} is not readable ({kind})"


def test_a_finetune_checks_every_shard_and_falls_back_from_a_damaged_newest(tmp_path, capsys):
    older = _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    shard = os.path.join(newest, ckpt.DCP_DIR, "__0_0.distcp")
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    resume = ckpt.open_resume(str(tmp_path), finetune=True)
    assert (resume.folder, resume.iteration, resume.finetune) == (older, 1, True)
    assert "resuming from the previous intact iteration 1" in capsys.readouterr().out


# ------------------------------------------------------------------ removals the OS refuses


@pytest.fixture
def undeletable(monkeypatch):
    """Paths under which os.unlink fails as on a read-only mount (root ignores permissions, so it is faked)."""
    refused = []
    real_unlink = os.unlink

    def unlink(path, *args, dir_fd=None, **kwargs):
        where = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path) if dir_fd is not None else str(path)
        if any(where.startswith(r + os.sep) for r in refused):
            raise PermissionError(13, "Permission denied", where)
        return real_unlink(path, *args, dir_fd=dir_fd, **kwargs)
    monkeypatch.setattr(os, "unlink", unlink)
    return refused


def _workers(fail=False):
    def save(folder):
        os.makedirs(os.path.join(folder, ckpt.DCP_DIR))
        with open(os.path.join(folder, ckpt.DCP_DIR, "__0_0.distcp"), "wb") as f:
            f.write(b"x")
        if fail:
            raise RuntimeError("rank 1 died mid-save")
        open(os.path.join(folder, ckpt.DCP_DIR, ".metadata"), "wb").close()
    return save


def test_a_stale_partial_save_the_os_will_not_remove_does_not_stop_the_save(tmp_path, undeletable):
    import socket
    import subprocess
    import sys
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    stale = tmp_path / f".tmp-iter_0000001-{socket.gethostname().replace('-', '_')}-{dead}-abcd1234"
    (stale / ckpt.DCP_DIR).mkdir(parents=True)
    (stale / ckpt.DCP_DIR / "__0_0.distcp").write_bytes(b"x")
    undeletable.append(str(stale))
    folder = ckpt.Checkpointer(str(tmp_path), _workers()).save(2, {"kl_coef": 0.1})
    assert ckpt.resolve(str(tmp_path)) == (folder, 2)
    assert stale.exists()  # left as it was; the next save tries again


def test_a_failed_save_whose_temporary_cannot_be_removed_raises_the_save_error(tmp_path, undeletable):
    undeletable.append(str(tmp_path))  # every file under the root
    with pytest.raises(RuntimeError, match="rank 1 died mid-save"):
        ckpt.Checkpointer(str(tmp_path), _workers(fail=True)).save(1, {"kl_coef": 0.1})


def test_a_replaced_folder_that_cannot_be_removed_leaves_the_new_save_complete(tmp_path, undeletable):
    ckpt.Checkpointer(str(tmp_path), _workers()).save(3, {"kl_coef": 0.1})
    undeletable.append(str(tmp_path))  # the old folder of iteration 3, moved aside, cannot be emptied
    folder = ckpt.Checkpointer(str(tmp_path), _workers()).save(3, {"kl_coef": 0.2})
    assert ckpt.resolve(str(tmp_path)) == (folder, 3) and ckpt.read_state(folder)["kl_coef"] == 0.2
