"""The stage-table trainer's own state: its defaults, the KL controller it builds, partial rollout's pool and
dispatch, the driver state a checkpoint adds, and the skipped-steps baseline."""
import pytest

from mindspeed_rl.algorithms.kl import AdaptiveKLController, FixedKLController
from mindspeed_rl.trainer import modes, partial_rollout
from mindspeed_rl.trainer import stage_trainer as st
from ut.trainer.test_grpo_trainer_driver import Saving, _trainer


def test_defaults_of_a_trainer_built_with_the_plan_alone():
    trainer = _trainer(Saving())
    plain = st.StageTableTrainer(actor_worker=Saving(), run_plan=trainer.run_plan)
    assert isinstance(plain.kl_ctrl, FixedKLController) and plain.kl_ctrl.value == 0.001
    assert plain.save_interval == 0 and plain.iteration == 0 and plain.carry_pool is None
    assert plain.rollout_passes == 0 and plain.transfer_dock is not None
    adaptive = st.StageTableTrainer(actor_worker=Saving(), run_plan=trainer.run_plan, kl_ctrl_type="adaptive")
    assert isinstance(adaptive.kl_ctrl, AdaptiveKLController)
    assert (adaptive.kl_ctrl.value, adaptive.kl_ctrl.target, adaptive.kl_ctrl.horizon) == (0.001, 100.0, 1000)
    given = _trainer(Saving(), kl_ctrl_type="adaptive", kl_target=0.5, kl_horizon=7)
    assert (given.kl_ctrl.target, given.kl_ctrl.horizon) == (0.5, 7)
    assert plain.rejection_guard.limit == 1 and plain.reward_guard.limit == 1
    guarded = _trainer(Saving(), max_all_rejected_iterations=4, max_failed_reward_iterations=0)
    assert guarded.rejection_guard.limit == 4 and guarded.reward_guard.limit == 0


def test_missing_plan_and_missing_group_are_named():
    with pytest.raises(ValueError, match=r"^the trainer needs the run_plan \(config_cls.RunPlan\) of the run$"):
        st.StageTableTrainer(actor_worker=Saving())
    plan = _trainer(Saving()).run_plan
    with pytest.raises(ValueError, match=r"on role 'actor', but no worker group was given for it \(groups: \[\]\)"):
        st.StageTableTrainer(run_plan=plan)


def test_partial_rollout_makes_the_pool_and_takes_the_step(monkeypatch):
    trainer = _trainer(Saving(), "rl_config.partial_rollout_max_split=2", eos_id=13)
    pool = trainer.carry_pool
    assert pool is not None and pool.eos_id == 13 and pool.extra_columns == ("labels",)
    assert pool.pass_tokens == trainer.run_plan.partial.pass_tokens and trainer.rollout_passes == 0
    calls = []
    monkeypatch.setitem(modes.STEPS, "sync", lambda *a: calls.append(a) or {"m": 1.0})
    batch = {"prompts": []}
    assert trainer.step(4, batch) == {"m": 1.0} and calls == [(trainer, 4, batch)]  # the run's mode steps


def test_a_partial_run_saves_and_loads_its_pool_with_the_groups(monkeypatch, tmp_path, capsys):
    group = Saving()
    trainer = _trainer(group, "rl_config.partial_rollout_max_split=2", eos_id=13)
    saved, loaded = [], []
    monkeypatch.setattr(partial_rollout, "save_pool", lambda *a: saved.append(a))
    monkeypatch.setattr(partial_rollout, "load_pool", lambda *a: loaded.append(a) or 3)
    trainer._save_groups(str(tmp_path))
    assert group.flags == [(True, True)] and saved == [(trainer, str(tmp_path))]
    trainer.load_driver_state("F")
    assert loaded == [(trainer, "F")]
    assert capsys.readouterr().out == "partial rollout: continuing 3 rows of F's pool\n"
    monkeypatch.setattr(partial_rollout, "load_pool", lambda *a: 0)
    trainer.load_driver_state("F")
    assert capsys.readouterr().out == ""  # an empty pool says nothing


def test_a_pool_left_by_a_partial_run_is_named_when_partial_rollout_is_off(monkeypatch, capsys):
    trainer = _trainer(Saving())
    seen = []
    monkeypatch.setattr(partial_rollout, "dropped_pool_line", lambda folder: seen.append(folder) or "warning: x")
    trainer.load_driver_state("F")
    assert seen == ["F"] and capsys.readouterr().out == "warning: x\n"
    monkeypatch.setattr(partial_rollout, "dropped_pool_line", lambda folder: None)
    trainer.load_driver_state("F")
    assert capsys.readouterr().out == ""


def test_skipped_steps_start_from_zero_for_every_engine():
    assert st.skipped_steps({}, {}) == {"critic": 0.0, "actor": 0.0}
    assert st.skipped_steps({"actor/skipped_steps": 2.0}, {"critic": 1.0}) == {"critic": 1.0, "actor": 2.0}
