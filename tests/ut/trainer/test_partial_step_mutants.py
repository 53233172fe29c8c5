"""Partial rollout's pool file (trainer/partial_rollout.py, mutation round 8): a checkpoint's pool is read with
torch's weights-only unpickler, so a file that would run code when unpickled is refused as unreadable and the code
never runs."""
import os
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.trainer import partial_rollout
from mindspeed_rl.trainer.utils.carry_pool import CarryPool

RAN = []


def _record(tag):
    RAN.append(tag)
    return []


class _Payload:
    """Unpickling this calls ``_record``: what a crafted checkpoint could do with any callable."""

    def __reduce__(self):
        return _record, ("unpickled",)


def _trainer():
    return SimpleNamespace(carry_pool=CarryPool(2, 8, 4, 0), rollout_passes=0, pool_identity=None)


def test_a_pool_file_that_runs_code_when_unpickled_is_refused_and_the_code_never_runs(tmp_path):
    RAN.clear()
    # everything load_state_dict needs, so only the unpickler can refuse it
    state = {"rows": _Payload(), "next_group": 0, "n": 2, "max_tokens": 8, "pass_tokens": 4, "rollout_passes": 3}
    torch.save(state, os.path.join(tmp_path, partial_rollout.POOL_FILE))
    trainer = _trainer()
    with pytest.raises(ValueError, match=r"partial rollout: cannot read .*carry_pool\.pt: UnpicklingError: "):
        partial_rollout.load_pool(trainer, str(tmp_path))
    assert RAN == []
    assert trainer.rollout_passes == 0 and trainer.carry_pool.rows == []


def test_a_pool_of_plain_tensors_ints_and_lists_loads_with_the_weights_only_unpickler(tmp_path):
    saved = _trainer()
    saved.carry_pool.add({"prompts": [torch.tensor([5, 6], dtype=torch.int32)]})
    saved.carry_pool.extend([0, 1], [torch.tensor([7, 0]), torch.tensor([9])],
                            [torch.tensor([-0.5, -1.0]), torch.tensor([-2.0])], iteration=4)
    saved.rollout_passes = 3
    partial_rollout.save_pool(saved, str(tmp_path))
    again = _trainer()
    assert partial_rollout.load_pool(again, str(tmp_path)) == 2
    assert again.rollout_passes == 3
    assert [r["tokens"].tolist() for r in again.carry_pool.rows] == [[7, 0], [9]]
    assert [r["done"] for r in again.carry_pool.rows] == [True, True]
