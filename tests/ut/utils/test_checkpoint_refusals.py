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
