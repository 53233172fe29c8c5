"""Checkpointer.restore: the workers load the folder ``find`` chose, and the driver continues
from the state saved with it (iteration, KL coefficient, data position)."""
import os

import pytest

from mindspeed_rl.utils import checkpoint as ckpt


class _Workers:
    def __init__(self):
        self.calls = []

    def load(self, folder, iteration, with_optimizer, with_rng):
        self.calls.append((folder, iteration, with_optimizer, with_rng))


def _saved(root, iteration, **state):
    folder = ckpt.iteration_dir(str(root), iteration)
    os.makedirs(folder)
    ckpt.write_state(folder, dict(state, iteration=iteration))
    return folder


def test_restore_loads_the_workers_and_returns_the_saved_driver_state(tmp_path):
    folder = _saved(tmp_path, 6, kl_coef=0.25, data_position=9)
    workers = _Workers()
    state = ckpt.Checkpointer(str(tmp_path), load_workers=workers.load).restore(
        (folder, 6), with_optimizer=False, with_rng=True)
    assert workers.calls == [(folder, 6, False, True)]
    assert state == {"iteration": 6, "kl_coef": 0.25, "data_position": 9}


def test_an_old_state_with_a_dock_round_still_loads(tmp_path):
    # versions before the stage runner saved the dock's round count too; it follows from data_position
    folder = _saved(tmp_path, 6, kl_coef=0.25, data_position=9, dock_round=6)
    assert ckpt.resume_state((folder, 6)) == {"iteration": 6, "kl_coef": 0.25, "data_position": 9}


def test_an_old_state_without_data_position_counts_one_batch_per_iteration(tmp_path):
    folder = _saved(tmp_path, 4, kl_coef=0.5)
    state = ckpt.resume_state((folder, 4))
    assert state["data_position"] == 4 and state["kl_coef"] == 0.5


def test_weights_only_starts_at_zero_and_never_reads_the_state(tmp_path):
    folder = _saved(tmp_path, 3, kl_coef=0.5, data_position=7)
    open(os.path.join(folder, ckpt.STATE), "w").close()  # unreadable: finetune does not need it
    workers = _Workers()
    state = ckpt.Checkpointer(str(tmp_path), load_workers=workers.load).restore((folder, 3), weights_only=True)
    assert workers.calls == [(folder, 0, False, False)]
    assert state == {"iteration": 0, "data_position": 0}
    with pytest.raises(ckpt.CheckpointError, match="trainer_state.json"):
        ckpt.Checkpointer(str(tmp_path), load_workers=workers.load).restore((folder, 3))
    assert len(workers.calls) == 1  # a bad state is found before any worker loads


def test_a_fresh_run_starts_from_zero():
    assert ckpt.resume_state(None) == {"iteration": 0, "data_position": 0}
