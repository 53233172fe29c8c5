"""RayDAPOTrainer.step's metrics and its plain-GRPO path, with the in-process workers of test_dapo_sampling."""
import torch

from tests.ut.dapo.test_dapo_sampling import _trainer, _trained, batches, local  # noqa: F401 (fixture)


def test_a_full_batch_reports_the_batches_drawn_and_no_shortfall(local, capsys):
    trainer, _ = _trainer()
    data = batches()
    trainer._data = data
    m = trainer.step(1, next(data))
    # two batches filled the 6 groups: the upstream metric name counts them too
    assert m["train/num_gen_batches"] == 2.0 == m["dapo/rollout_batches"]
    assert "dynamic sampling stopped" not in capsys.readouterr().out


def test_without_dynamic_sampling_the_step_is_grpos_on_one_batch(local):
    trainer, workers = _trainer("rl_config.filter_groups_enable=false", "rl_config.mini_batch_size=8")
    data = batches()
    trainer._data = data
    m = trainer.step(4, next(data))
    # no group dropped: all 8 prompts x 3 samples trained, no DAPO metric, one batch drawn
    assert "dapo/kept_groups" not in m
    assert len(_trained(workers)) == 24
    # a fresh trainer counts one batch per iteration: after iteration 4 it has taken 4
    assert trainer.data_position == 4
    assert all(isinstance(v, float) for v in m.values())
