"""RayGRPOTrainer's driver loop in-process (no Ray): fit's save schedule and non-finite policy over
scripted iterations with real checkpoints in a temporary folder, a failed save, the driver state, the
per-iteration helpers (first non-finite quantity, verifier fault lines, rank timings, console summary)
and one real step over two in-process IntegratedWorkers."""
import json
import math
import os
from pathlib import Path

import pytest
import torch

import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import REWARD
from mindspeed_rl.trainer import driver_stages, stage_trainer as hybrid
from mindspeed_rl.trainer.modes import sync
from mindspeed_rl.trainer.utils.reward_guard import RewardFailureError
from mindspeed_rl.utils import checkpoint as ckpt
from mindspeed_rl.workers.parallel_state import ParallelState
from ut.dapo.test_dapo_sampling import Engine, Group, Reward, batches

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"
PPO = TINY.parent / "ppo_tiny_cpu.yaml"
NAN = float("nan")


class Saving:
    """A worker group that writes one file per save (or raises ``fail``) and records the flags it got."""

    def __init__(self, fail=None):
        self.flags, self.fail = [], fail

    def save_checkpoint(self, folder, with_optimizer, with_rng):
        if self.fail is not None:
            raise self.fail
        self.flags.append((with_optimizer, with_rng))
        Path(folder, "weights.txt").write_text("w")


class Log:
    """A MetricsLogger that keeps what it is given."""

    def __init__(self):
        self.lines, self.metrics, self.balance = [], [], []

    def log(self, iteration, metrics, line):
        self.lines.append((iteration, line))
        self.metrics.append(metrics)

    def log_balance(self, iteration, plans):
        self.balance.append((iteration, plans))


def _trainer(group, *overrides, **kwargs):
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides]))
    return hybrid.StageTableTrainer(actor_worker=group, reward_list=[Reward()], run_plan=cfgs.plan,
                                 dataset_additional_keys=["labels"], init_kl_coef=cfgs.rl_config.init_kl_coef,
                                 **kwargs)


def _ok(**extra):
    return {"reward/mean": 0.5, "actor/pg_loss": 0.1, "actor/grad_norm": 1.0, **extra}


def _script(trainer, script):
    """fit's iterations return these metrics (iteration k: script[k - 1]); the steps run are recorded."""
    trainer.ran = []

    def step(iteration, batch):
        trainer.ran.append(iteration)
        return dict(script[iteration - 1])
    trainer.step = step


def _saved(root):
    return sorted(int(name[len("iter_"):]) for name in os.listdir(root) if name.startswith("iter_"))


def _tracker(root):
    return int(Path(root, ckpt.TRACKER).read_text())


# ------------------------------------------------------------------ fit: the save schedule


def test_fit_saves_every_interval_and_the_last_iteration(tmp_path, capsys):
    group = Saving()
    trainer = _trainer(group, "megatron_training.train_iters=5", save_interval=2, save_dir=str(tmp_path))
    _script(trainer, [_ok()] * 5)
    history = trainer.fit(iter(range(9)))
    assert trainer.ran == [1, 2, 3, 4, 5] and len(history) == 5
    assert _saved(tmp_path) == [2, 4, 5] and _tracker(tmp_path) == 5 and trainer.last_saved == 5
    assert group.flags == [(True, True)] * 3  # the optimizer and RNG state are saved by default
    state = json.loads(Path(ckpt.iteration_dir(str(tmp_path), 4), ckpt.STATE).read_text())
    # no batch was taken through step(): the data position is the iteration
    # the algorithm the checkpoint trained is recorded with it
    assert state == {"iteration": 4, "kl_coef": trainer.kl_ctrl.value, "data_position": 4, "algorithm": {
        "name": "GRPO", "megatron_training.stage": "ray_grpo", "rl_config.adv_estimator": "group_norm",
        "rl_config.norm_adv_by_std_in_grpo": True, "rl_config.loss_mode": "vanilla",
        "rl_config.loss_agg_mode": "token-mean"}}
    assert Path(ckpt.iteration_dir(str(tmp_path), 4), "weights.txt").is_file()
    assert capsys.readouterr().out.count("saved checkpoint ") == 3


@pytest.mark.parametrize("optimizer, rng", [(False, False), (True, False), (False, True)])
def test_save_flags_reach_every_worker_group(tmp_path, optimizer, rng):
    actor, critic = Saving(), Saving()
    cfgs = build_configs(load_config(PPO, ["megatron_training.model_path=/unused", "megatron_training.train_iters=1"]))
    trainer = hybrid.StageTableTrainer(actor_worker=actor, critic_worker=critic, reward_list=[Reward()],
                                    run_plan=cfgs.plan, dataset_additional_keys=["labels"], init_kl_coef=0.04,
                                    save_interval=1, save_dir=str(tmp_path), save_optimizer=optimizer, save_rng=rng)
    _script(trainer, [_ok()])
    trainer.fit(iter(range(1)))
    assert actor.flags == critic.flags == [(optimizer, rng)]  # each group saved once, with the run's flags


def test_without_a_save_folder_nothing_is_saved(capsys):
    group = Saving()
    trainer = _trainer(group, "megatron_training.train_iters=2", save_interval=1, save_dir=None)
    _script(trainer, [_ok()] * 2)
    trainer.fit(iter(range(2)))
    assert group.flags == [] and trainer.last_saved is None
    assert "saved checkpoint" not in capsys.readouterr().out


def test_without_an_interval_only_the_last_iteration_is_saved(tmp_path):
    trainer = _trainer(Saving(), "megatron_training.train_iters=3", save_interval=0, save_dir=str(tmp_path))
    _script(trainer, [_ok()] * 3)
    trainer.fit(iter(range(3)))
    assert _saved(tmp_path) == [3]


def test_a_save_due_on_a_nonfinite_iteration_is_made_by_the_next_finite_one(tmp_path, capsys):
    trainer = _trainer(Saving(), "megatron_training.train_iters=6", save_interval=3, save_dir=str(tmp_path))
    _script(trainer, [_ok(), _ok(), _ok(**{"actor/pg_loss": NAN}), _ok(), _ok(), _ok()])
    trainer.fit(iter(range(6)))
    # 3 was due but not finite: 4 saves instead, 5 is not due, 6 is (interval and last)
    assert _saved(tmp_path) == [4, 6]
    out = capsys.readouterr().out
    assert ("warning: iteration 3: non-finite actor/pg_loss=nan; its optimizer steps were skipped; "
            "no checkpoint is written from it (1 of 3 in a row allowed)") in out


def test_a_resumed_fit_runs_the_iterations_left_with_the_checkpoints_kl_coefficient(tmp_path):
    trainer = _trainer(Saving(), "megatron_training.train_iters=4", save_interval=2, save_dir=str(tmp_path))
    _script(trainer, [_ok()] * 4)
    trainer.fit(iter(range(4)), start_iteration=2, kl_coef=0.3)
    assert trainer.ran == [3, 4] and trainer.kl_ctrl.value == 0.3
    assert _saved(tmp_path) == [4]
    assert trainer.transfer_dock.round == 2  # the dock's rounds continue from the checkpoint's


def test_a_fresh_fit_keeps_the_configured_kl_coefficient():
    trainer = _trainer(Saving(), "megatron_training.train_iters=1", "rl_config.init_kl_coef=0.05")
    _script(trainer, [_ok()])
    trainer.fit(iter(range(1)))
    assert trainer.kl_ctrl.value == 0.05 and trainer.transfer_dock.round == 0


def test_fit_logs_each_iteration_and_prints_verifier_faults(capsys):
    log = Log()
    trainer = _trainer(Saving(), "megatron_training.train_iters=2", logger=log)
    _script(trainer, [_ok(), _ok(**{"reward/math/timeouts": 2.0, "reward/math/errors": 0.0})])
    history = trainer.fit(iter(range(2)))
    assert [i for i, _ in log.lines] == [1, 2] and log.metrics == history
    assert log.lines[0][1] == hybrid.StageTableTrainer._summary(1, history[0])
    captured = capsys.readouterr()
    assert "iter 2: verifier faults (scored 0): math: 2 timed out, 0 raised" in captured.out
    assert "iter 1: verifier faults" not in captured.out
    assert captured.err == ""  # no progress bar when stderr is not a terminal


def test_an_iteration_without_reward_metrics_still_runs():
    trainer = _trainer(Saving(), "megatron_training.train_iters=1")
    _script(trainer, [{"actor/pg_loss": 0.1}])
    assert trainer.fit(iter(range(1))) == [{"actor/pg_loss": 0.1}]


# ------------------------------------------------------------------ fit: non-finite iterations


def test_a_nonfinite_streak_without_a_save_folder_says_no_checkpoint_was_written(capsys):
    trainer = _trainer(Saving(), "megatron_training.train_iters=4", max_nonfinite_iterations=2)
    _script(trainer, [_ok(**{"actor/grad_norm": math.inf}), _ok(**{"actor/pg_loss": NAN})] * 2)
    with pytest.raises(hybrid.NonFiniteError) as info:
        trainer.fit(iter(range(4)))
    assert str(info.value) == ("2 iterations in a row (1-2) had non-finite values "
                               "(rl_config.max_nonfinite_iterations=2); the first: iteration 1: actor/grad_norm=inf; "
                               "no checkpoint was written")
    out = capsys.readouterr().out
    assert ("warning: iteration 1: non-finite actor/grad_norm=inf; its optimizer steps were skipped "
            "(1 of 2 in a row allowed)\n") in out
    assert trainer.ran == [1, 2]


def test_a_nonfinite_streak_before_any_save_says_no_checkpoint_was_written(tmp_path):
    trainer = _trainer(Saving(), "megatron_training.train_iters=4", max_nonfinite_iterations=2,
                       save_interval=10, save_dir=str(tmp_path))
    _script(trainer, [_ok(**{"actor/pg_loss": NAN})] * 4)
    with pytest.raises(hybrid.NonFiniteError) as info:
        trainer.fit(iter(range(4)))
    assert str(info.value).endswith("iteration 1: actor/pg_loss=nan; no checkpoint was written")


def test_a_nonfinite_streak_after_a_resume_names_the_checkpoint_resumed_from(tmp_path):
    trainer = _trainer(Saving(), "megatron_training.train_iters=6", max_nonfinite_iterations=2,
                       save_interval=10, save_dir=str(tmp_path))
    _script(trainer, [_ok(**{"reward/mean": NAN})] * 6)
    with pytest.raises(hybrid.NonFiniteError) as info:
        trainer.fit(iter(range(6)), start_iteration=3)
    assert str(info.value).endswith(f"iteration 4: reward/mean=nan; the last checkpoint is iteration 3 in {tmp_path}")
    assert "(4-5)" in str(info.value) and _saved(tmp_path) == []


def test_a_skipped_optimizer_step_counts_only_when_the_count_grows(capsys):
    trainer = _trainer(Saving(), "megatron_training.train_iters=3", max_nonfinite_iterations=2)
    # the engine's running count of skipped steps: 1 after iteration 1, still 1 after 2, 2 after 3
    _script(trainer, [_ok(**{"actor/skipped_steps": 1.0}), _ok(**{"actor/skipped_steps": 1.0}),
                      _ok(**{"actor/skipped_steps": 2.0})])
    trainer.fit(iter(range(3)))
    out = capsys.readouterr().out
    assert "warning: iteration 1: non-finite grad norm (the engine skipped 1 optimizer step(s))" in out
    assert "iteration 2:" not in out
    assert "warning: iteration 3: non-finite grad norm (the engine skipped 1 optimizer step(s))" in out


def test_an_iteration_that_does_not_report_skipped_steps_keeps_the_last_count(capsys):
    trainer = _trainer(Saving(), "megatron_training.train_iters=3")
    _script(trainer, [_ok(**{"actor/skipped_steps": 1.0}), _ok(), _ok(**{"actor/skipped_steps": 1.0})])
    trainer.fit(iter(range(3)))
    out = capsys.readouterr().out
    assert "iteration 1:" in out and "iteration 3:" not in out  # the count did not grow after iteration 1


def test_a_zero_limit_never_stops_and_counts_nothing(capsys):
    trainer = _trainer(Saving(), "megatron_training.train_iters=3", max_nonfinite_iterations=0)
    _script(trainer, [_ok(**{"actor/pg_loss": NAN})] * 3)
    assert len(trainer.fit(iter(range(3)))) == 3
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert lines == [f"warning: iteration {i}: non-finite actor/pg_loss=nan; its optimizer steps were skipped"
                     for i in (1, 2, 3)]


# ------------------------------------------------------------------ save and the driver state


def test_a_failed_save_names_the_iteration_the_folder_and_the_checkpoint_still_tracked(tmp_path):
    group = Saving()
    trainer = _trainer(group, save_dir=str(tmp_path))
    group.fail = OSError(28, "No space left on device")
    with pytest.raises(hybrid.CheckpointSaveError) as info:
        trainer.save(2)
    assert str(info.value) == (f"saving iteration 2 into {str(tmp_path)!r} failed: OSError: [Errno 28] No space left on "
                               f"device; the checkpoint tracker still names no iteration")
    group.fail = None
    assert trainer.save(2) == ckpt.iteration_dir(str(tmp_path), 2) and trainer.last_saved == 2
    group.fail = OSError(28, "No space left on device")
    with pytest.raises(hybrid.CheckpointSaveError, match="the checkpoint tracker still names iteration 2$"):
        trainer.save(4)
    assert _tracker(tmp_path) == 2 and _saved(tmp_path) == [2] and trainer.last_saved == 2


class Clock:
    """time.perf_counter's stand-in: the given readings in turn."""

    def __init__(self, *readings):
        self.readings = list(readings)

    def perf_counter(self):
        return self.readings.pop(0)


def test_a_save_prints_its_folder_and_how_long_it_took(tmp_path, monkeypatch, capsys):
    trainer = _trainer(Saving(), save_dir=str(tmp_path))
    monkeypatch.setattr(hybrid, "time", Clock(100.0, 102.5))
    folder = trainer.save(3)
    assert capsys.readouterr().out == f"saved checkpoint {folder} in 2.50s\n"


def test_the_driver_state_counts_the_batches_taken():
    trainer = _trainer(Saving())
    assert trainer.state_dict(3) == {"iteration": 3, "kl_coef": trainer.kl_ctrl.value, "data_position": 3,
                                     "algorithm": trainer.algorithm}
    resumed = _trainer(Saving(), data_position=7)
    assert resumed.state_dict(3)["data_position"] == 7


def test_load_state_dict_gives_back_what_state_dict_saved():
    trainer = _trainer(Saving(), data_position=9)
    trainer.kl_ctrl.value = 0.25
    saved = trainer.state_dict(5)
    resumed = _trainer(Saving())
    resumed.load_state_dict(saved)
    assert resumed.state_dict(5) == saved and resumed.iteration == 5 and resumed.last_saved == 5
    fresh = _trainer(Saving())
    before = fresh.kl_ctrl.value
    fresh.load_state_dict({"iteration": 0, "data_position": 0})  # a fresh run's state: no KL saved yet
    assert fresh.kl_ctrl.value == before and fresh.data_position == 0 and fresh.last_saved is None


def test_the_reference_runs_on_the_actors_group_unless_one_is_given():
    actor, ref = Saving(), Saving()
    trainer = _trainer(actor)
    assert trainer.groups["ref"] is actor
    trainer = _trainer(actor, ref_worker=ref)
    assert trainer.groups["ref"] is ref and trainer.groups["actor"] is actor


def test_train_iters_come_from_the_plan_unless_given():
    assert _trainer(Saving(), "megatron_training.train_iters=7").train_iters == 7
    assert _trainer(Saving(), "megatron_training.train_iters=7", train_iters=2).train_iters == 2


# ------------------------------------------------------------------ per-iteration helpers


def test_first_nonfinite_reports_rewards_with_what_is_known_of_the_first_row():
    assert hybrid.first_nonfinite({"reward/nonfinite": 2.0}) == "reward in 2 rows"
    assert hybrid.first_nonfinite({"reward/nonfinite": 2.0, "reward/first_nonfinite_row": 5.0}) == \
        "reward in 2 rows (first row 5)"
    assert hybrid.first_nonfinite({"reward/nonfinite": 2.0, "reward/first_nonfinite_row": 5.0,
                                   "reward/first_nonfinite_value": math.inf}) == "reward in 2 rows (first row 5, score inf)"
    assert hybrid.first_nonfinite({"reward/nonfinite": 0.0, "actor/kl": NAN}) == "actor/kl=nan"


def test_first_nonfinite_takes_the_quantities_in_causal_order():
    assert hybrid.first_nonfinite({"actor/grad_norm": NAN, "actor/entropy": -math.inf}) == "actor/entropy=-inf"
    assert hybrid.first_nonfinite({"actor/grad_norm": NAN, "actor/kl": math.inf}) == "actor/kl=inf"
    assert hybrid.first_nonfinite({"actor/grad_norm": NAN}) == "actor/grad_norm=nan"
    assert hybrid.first_nonfinite(_ok(**{"actor/kl": 0.0, "actor/entropy": 2.0})) is None
    assert hybrid.first_nonfinite({}) is None


def test_first_nonfinite_counts_skipped_steps_since_the_last_iteration():
    assert hybrid.first_nonfinite({"actor/skipped_steps": 3.0}, 1.0) == \
        "grad norm (the engine skipped 2 optimizer step(s))"
    assert hybrid.first_nonfinite({"actor/skipped_steps": 1.0}) == "grad norm (the engine skipped 1 optimizer step(s))"
    assert hybrid.first_nonfinite({"actor/skipped_steps": 1.0}, 1.0) is None
    assert hybrid.first_nonfinite({"actor/skipped_steps": 0.0}) is None


def test_verifier_fault_lines_name_each_verifier_once_in_name_order():
    m = {"reward/mean": 0.2, "reward/math/timeouts": 0.0, "reward/math/errors": 2.0,
         "reward/code/errors": 1.0, "reward/abc/timeouts": 3.0}
    assert hybrid.verifier_fault_lines(4, m) == [
        "iter 4: verifier faults (scored 0): abc: 3 timed out, 0 raised; math: 0 timed out, 2 raised; code: 1 raised"]
    assert hybrid.verifier_fault_lines(4, {"reward/code/errors": 0.0, "reward/math/timeouts": 0.0}) == []


def test_rank_timing_metrics_keep_only_stage_figures_with_each_ranks_and_the_extremes():
    out = hybrid.rank_timing_metrics([
        {"rank": 0.0, "timing/rollout": 2.0, "memory/peak": 5.0, "actor/pg_loss": 0.3},
        {"rank": 1.0, "timing/rollout": 4.0, "tokens/rollout": 9.0},
        {"rank": 2.0, "timing/rollout": 3.0, "memory/peak": 1.0}])
    assert out == {"timing/rollout/rank0": 2.0, "timing/rollout/rank1": 4.0, "timing/rollout/rank2": 3.0,
                   "timing/rollout/max": 4.0, "timing/rollout/min": 2.0,
                   "tokens/rollout/rank1": 9.0, "tokens/rollout/max": 9.0, "tokens/rollout/min": 9.0,
                   "memory/peak/rank0": 5.0, "memory/peak/rank2": 1.0, "memory/peak/max": 5.0, "memory/peak/min": 1.0}


def test_the_console_summary_has_each_figure_or_a_dash():
    line = hybrid.StageTableTrainer._summary(2, {
        "reward/mean": 0.5, "response_length/mean": 3.25, "actor/pg_loss": 0.12345, "actor/kl": 0.001,
        f"timing/{hybrid.TRAIN.name}/max": 1.5, f"timing/{hybrid.TRAIN.name}/min": 1.0})
    assert line == "iter 2: reward=0.500 resp_len=3.25 loss=0.1235 kl=0.0010 update max/min rank s=1.50/1.00 "
    assert hybrid.StageTableTrainer._summary(3, {}) == \
        "iter 3: reward=- resp_len=- loss=- kl=- update max/min rank s=-/- "
    # a non-finite figure reads as nan, in lower case like the warnings
    every = ("reward/mean", "response_length/mean", "actor/pg_loss", "actor/kl", f"timing/{hybrid.TRAIN.name}/max",
             f"timing/{hybrid.TRAIN.name}/min")
    assert hybrid.StageTableTrainer._summary(3, dict.fromkeys(every, NAN)) == \
        "iter 3: reward=nan resp_len=nan loss=nan kl=nan update max/min rank s=nan/nan "
    # balanced stages with a rank imbalance, in the stage table's order, one space apart
    line = hybrid.StageTableTrainer._summary(3, {"dp_balance/actor_train/rank_imbalance": 0.01,
                                              "dp_balance/ref_log_prob/rank_imbalance": 0.125,
                                              "dp_balance/ref_log_prob/rank_imbalance_random": 0.5})
    assert line.endswith(" s=-/- ref_log_prob:imb=12.50%(random 50.00%) actor_train:imb=1.00%(random -)")
    # the queued rollout first: its engines' imbalance, the static split's (replayed) and the distance to its bound
    line = hybrid.StageTableTrainer._summary(3, {"dp_balance/actor_rollout/bound_gap": 0.034,
                                              "dp_balance/actor_rollout/rank_imbalance": 0.009,
                                              "dp_balance/actor_rollout/rank_imbalance_random": 0.064,
                                              "dp_balance/actor_train/rank_imbalance": 0.01})
    assert line.endswith(" s=-/- actor_rollout:imb=0.90%(static 6.40%) bound+3.4% actor_train:imb=1.00%(random -)")
    line = hybrid.StageTableTrainer._summary(3, {"dp_balance/actor_rollout/bound_gap": 0.0})
    assert line.endswith(" s=-/- actor_rollout:imb=-(static -) bound+0.0% ")
    # a rollout without the queue's figures (guarantee_order) says nothing of it
    assert "actor_rollout" not in hybrid.StageTableTrainer._summary(3, {"dp_balance/actor_rollout/rank_imbalance": 0.2})


# ------------------------------------------------------------------ one real step


class KL:
    """A KL controller that records its updates."""

    def __init__(self, value):
        self.value, self.updates = value, []

    def update(self, kl, rows):
        self.updates.append((kl, rows))


@pytest.fixture
def workers(monkeypatch):
    monkeypatch.setattr(iw, "CausalLMEngine", Engine)


def _real(*overrides, **kwargs):
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides]))
    plan = cfgs.plan
    ranks = []
    for rank in range(plan.layout.world_size):
        w = iw.IntegratedWorker(rank, plan.layout.world_size, plan)
        w.parallel_state = ParallelState.from_layout(rank, plan.layout)
        w.initialize("/unused", eos_id=13, pad_id=14)
        ranks.append(w)
    return hybrid.StageTableTrainer(actor_worker=Group(ranks), reward_list=[Reward()], run_plan=plan,
                                 dataset_additional_keys=["labels"], init_kl_coef=0.02, **kwargs)


def test_a_step_runs_the_stages_and_reports_the_update_timings_and_balance(workers):
    log = Log()
    trainer = _real(logger=log)
    trainer.kl_ctrl = KL(0.02)
    m = trainer.step(3, next(batches()))
    update = hybrid.TRAIN.name
    assert m["actor/pg_loss"] == 0.0  # the engine's loss, mean over the ranks
    assert m[f"timing/{update}/max"] >= m[f"timing/{update}/min"] > 0
    assert {f"timing/{update}/rank0", f"timing/{update}/rank1"} <= set(m)
    assert m["timing/iteration"] >= m[f"timing/{update}/max"]
    # the round's balance plans go to the logger under the iteration
    assert [i for i, _ in log.balance] == [3] and log.balance[0][1]
    # the KL controller sees the update's KL and the rows trained per round
    assert trainer.kl_ctrl.updates == [(m.get("actor/kl", 0.0), trainer.run_plan.train_rows_per_round)]
    # a fresh trainer has taken one batch per iteration up to this one
    assert trainer.data_position == 3 and trainer.iteration == 3
    trainer.step(4, next(batches(start=1)))
    assert trainer.data_position == 4 and trainer.state_dict(4)["data_position"] == 4


def test_a_resumed_trainer_counts_batches_from_its_data_position(workers):
    trainer = _real(data_position=10)
    trainer.step(6, next(batches()))
    assert trainer.data_position == 11


def test_a_prompt_longer_than_the_limit_is_refused_naming_its_row(workers):
    trainer = _real(max_prompt_length=2)
    batch = {"prompts": [torch.tensor([1, 2]), torch.tensor([1, 2, 3])] + [torch.tensor([1, 2])] * 6,
             "labels": [torch.tensor([1])] * 8}
    with pytest.raises(ValueError) as info:
        trainer.step(1, batch)
    assert str(info.value) == "prompt 1 of the batch has 3 tokens, more than rl_config.max_prompt_length=2"
    # at the limit it is taken
    batch["prompts"][1] = torch.tensor([1, 2])
    assert "timing/iteration" in trainer.step(1, batch)


# ------------------------------------------------------------------ PPO's driver stages and KL



class Runner:
    """Stands in for StageRunner: records the context of the run and returns set metrics."""
    seen = []

    def __init__(self, dock, groups):
        self.dock = dock

    def run(self, stages, driver, **context):
        Runner.seen.append(context)
        return {"actor/kl": 0.2, "actor/reward_kl": 0.7}, []


def _ppo(*overrides):
    cfgs = build_configs(load_config(PPO, ["megatron_training.model_path=/unused", *overrides]))
    trainer = hybrid.StageTableTrainer(actor_worker=object(), critic_worker=object(), reward_list=[Reward()],
                                    run_plan=cfgs.plan, dataset_additional_keys=["labels"], init_kl_coef=0.04)
    trainer.kl_ctrl = KL(0.04)
    return trainer


@pytest.mark.parametrize("in_reward, loss_coef, kl", [(False, 0.04, 0.2), (True, 0.0, 0.7)])
def test_with_the_kl_in_the_rewards_the_loss_has_none_and_the_controller_reads_the_rewards_kl(
        monkeypatch, in_reward, loss_coef, kl):
    monkeypatch.setattr(hybrid, "StageRunner", Runner)
    Runner.seen = []
    trainer = _ppo(f"rl_config.use_kl_in_reward={str(in_reward).lower()}", "rl_config.init_kl_coef=0.04")
    trainer.step(1, next(batches()))
    assert [c["kl_coef"] for c in Runner.seen] == [loss_coef] and Runner.seen[0]["iteration"] == 1
    assert trainer.kl_ctrl.updates == [(kl, trainer.run_plan.train_rows_per_round)]


def test_with_init_kl_coef_0_the_loss_gets_no_kl_whatever_the_controller_holds(monkeypatch):
    monkeypatch.setattr(hybrid, "StageRunner", Runner)
    Runner.seen = []
    trainer = _ppo("rl_config.init_kl_coef=0.0")  # the plan has no KL in the loss; the controller holds 0.04
    trainer.step(1, next(batches()))
    assert [c["kl_coef"] for c in Runner.seen] == [0.0]


def test_ppos_driver_stages_take_the_plans_gae_and_kl_settings(monkeypatch):
    calls = {}
    monkeypatch.setattr(driver_stages.ppo_stages, "compute_kl_rewards",
                        lambda *a: calls.setdefault("kl", a) and {"kl": 1.0})
    trainer = _ppo("rl_config.gamma=0.9", "rl_config.lam=0.8", "rl_config.use_kl_in_reward=true",
                   "rl_config.kl_penalty=kl")
    assert (trainer.run_plan.advantage.name, trainer.run_plan.advantage.gamma, trainer.run_plan.advantage.lam) == \
        ("gae", 0.9, 0.8)
    stage = object()
    trainer.kl_ctrl.value = 0.3  # the controller's current coefficient, not the initial one
    assert driver_stages.compute_kl_rewards(trainer, stage) == {"kl": 1.0}
    assert calls["kl"] == (trainer.transfer_dock, stage, 0.3, "kl")


def test_a_one_rank_step_reports_that_ranks_update_metrics(workers):
    trainer = _real("rl_config.actor_resource={num_npus: 1}")
    m = trainer.step(1, next(batches()))
    assert m["actor/pg_loss"] == 0.0 and f"timing/{hybrid.TRAIN.name}/rank0" in m
    assert f"timing/{hybrid.TRAIN.name}/rank1" not in m


def test_the_rewards_stage_applies_the_plans_overlong_penalty(workers):
    trainer = _real("rl_config.overlong_buffer_enable=true", "rl_config.overlong_buffer=4",
                    "rl_config.overlong_buffer_penalty_factor=1.0", "rl_config.rollout_max_tokens=10")
    m = trainer.step(1, next(batches()))
    # the engine's responses are 1-7 tokens: those past 10 - 4 tokens are penalised
    assert m["reward/overlong_penalty/frac"] > 0 and m["reward/overlong_penalty/mean"] < 0


def test_the_iteration_time_runs_from_the_steps_start_to_its_end(workers, monkeypatch):
    trainer = _real()
    clock = Clock(50.0, 53.25)  # the step's two readings of the driver's clock: its start (the mode's), its end
    monkeypatch.setattr(sync, "time", clock)
    monkeypatch.setattr(hybrid, "time", clock)
    assert trainer.step(1, next(batches()))["timing/iteration"] == 3.25


class FailedEverywhere:
    """A reward whose one verifier raised on every row of the last call."""
    last_failures = {"v": {"rows": 8, "errors": 8, "timeouts": 0, "weight": 1.0, "first_error": "ValueError: x"}}


def test_by_default_one_iteration_whose_rewards_all_failed_stops_the_run(monkeypatch):
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused"]))
    monkeypatch.setattr(driver_stages, "reward_stage", lambda *a, **k: {"reward/mean": 0.0})
    trainer = hybrid.StageTableTrainer(actor_worker=object(), reward_list=[FailedEverywhere()], run_plan=cfgs.plan)
    trainer.iteration = 2
    with pytest.raises(RewardFailureError, match=r"in iteration 2 \(rl_config.max_failed_reward_iterations=1\)"):
        driver_stages.compute_rewards(trainer, cfgs.plan.stages[REWARD.name])


def test_the_dock_keeps_every_dataset_column_the_trainer_is_given():
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused"]))
    trainer = hybrid.StageTableTrainer(actor_worker=object(), reward_list=[Reward()], run_plan=cfgs.plan,
                                    dataset_additional_keys=["labels", "source"])
    assert "source" in trainer.transfer_dock.experience_data  # a dataset key no stage reads is kept too
