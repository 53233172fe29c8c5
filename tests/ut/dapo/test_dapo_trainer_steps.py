"""RayDAPOTrainer.step's metrics and its plain-GRPO path, with the in-process workers of test_dapo_sampling."""
import torch

from tests.ut.dapo.test_dapo_sampling import _trainer, _trained, batches, local  # noqa: F401 (fixture)


def test_a_full_batch_reports_the_batches_drawn_and_no_shortfall(local, capsys):
    trainer, _ = _trainer()
    data = batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    # two batches filled the 6 groups: the upstream metric name counts them too
    assert m["train/num_gen_batches"] == 2.0 == m["dapo/rollout_batches"]
    assert "dynamic sampling stopped" not in capsys.readouterr().out


def test_without_dynamic_sampling_the_step_is_grpos_on_one_batch(local):
    trainer, workers = _trainer("rl_config.filter_groups_enable=false", "rl_config.mini_batch_size=8")
    data = batches()
    trainer.data_iter = data
    m = trainer.step(4, next(data))
    # no group dropped: all 8 prompts x 3 samples trained, no DAPO metric, one batch drawn
    assert "dapo/kept_groups" not in m
    assert len(_trained(workers)) == 24
    # a fresh trainer counts one batch per iteration: after iteration 4 it has taken 4
    assert trainer.data_position == 4
    assert all(isinstance(v, float) for v in m.values())


def test_fit_refills_from_its_data_iterator_and_takes_the_resumed_kl_coefficient(local):
    trainer, workers = _trainer("megatron_training.train_iters=2")
    history = trainer.fit(batches(), start_iteration=0, kl_coef=0.25)
    # each iteration drew 2 batches from the iterator fit was given (refills included)
    assert [m["dapo/rollout_batches"] for m in history] == [2.0, 2.0]
    assert trainer.data_position == 4
    assert len(_trained(workers)) == 2 * 18
    # the fixed KL controller keeps the coefficient passed in
    assert trainer.kl_ctrl.value == 0.25
    assert trainer.state_dict(2)["kl_coef"] == 0.25


def test_a_resumed_fit_runs_only_the_iterations_left(local):
    trainer, _ = _trainer("megatron_training.train_iters=2", data_position=2)
    history = trainer.fit(batches(start=2), start_iteration=1)
    assert len(history) == 1 and history[0]["dapo/rollout_batches"] == 2.0
    assert trainer.state_dict(2)["data_position"] == 4
