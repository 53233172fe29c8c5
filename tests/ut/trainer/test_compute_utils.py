import pytest

from mindspeed_rl.trainer.base import RayBaseTrainer
from mindspeed_rl.plan.run_plan import Layout, RunPlan
from mindspeed_rl.trainer.grpo_trainer_hybrid import rank_timing_metrics
from mindspeed_rl.utils.metrics import rank_balance_metrics
from mindspeed_rl.trainer.utils.compute_utils import AdaptiveKLController, FixedKLController


def test_fixed_kl_stays():
    ctrl = FixedKLController(0.01)
    ctrl.update(5.0, 100)
    assert ctrl.value == 0.01


def test_adaptive_kl_moves_towards_target_with_clipped_error():
    ctrl = AdaptiveKLController(0.1, target_kl=1.0, horizon=100)
    ctrl.update(3.0, 10)  # error clipped to +0.2
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    ctrl.update(0.0, 10)  # error clipped to -0.2
    assert ctrl.value < 0.1 * (1 + 0.2 * 10 / 100)
    with pytest.raises(ValueError, match="kl_horizon"):
        AdaptiveKLController(0.1, 1.0, 0)


def test_adaptive_kl_never_goes_negative_on_large_batches():
    ctrl = AdaptiveKLController(0.001, target_kl=1.0, horizon=1000)
    ctrl.update(0.0, 8192)  # -0.2 * 8192 / 1000 < -1
    assert ctrl.value == 0.0


def test_trainer_rejects_unknown_kl_control():
    plan = RunPlan(Layout(1, 1, 1), prompts_per_round=1, n_samples=1, mini_batch_rows=1, epochs=1, train_iters=1)
    with pytest.raises(ValueError, match="kl_ctrl_type"):
        RayBaseTrainer(run_plan=plan, kl_ctrl_type="pid")
    with pytest.raises(ValueError, match="run_plan"):
        RayBaseTrainer()


def test_rank_balance_metrics_count_tp_sources_only():
    results = [{"load/actor_train": 30.0, "rank": 0.0, "dp_rank": 0.0, "tp_rank": 0.0},
               {"load/actor_train": 30.0, "rank": 1.0, "dp_rank": 0.0, "tp_rank": 1.0},
               {"load/actor_train": 10.0, "rank": 2.0, "dp_rank": 1.0, "tp_rank": 0.0},
               {"load/actor_train": 10.0, "rank": 3.0, "dp_rank": 1.0, "tp_rank": 1.0}]
    out = rank_balance_metrics(results)
    assert out["dp_balance/actor_train/rank0"] == 30.0 and out["dp_balance/actor_train/rank1"] == 10.0
    assert out["dp_balance/actor_train/rank_imbalance"] == pytest.approx(30 / 20 - 1)


def test_rank_timing_metrics_per_rank_and_extremes():
    out = rank_timing_metrics([{"timing/update": 2.0, "tokens/update": 10.0, "rank": 0.0},
                               {"timing/update": 3.0, "tokens/update": 12.0, "rank": 1.0}])
    assert out["timing/update/rank1"] == 3.0
    assert out["timing/update/max"] == 3.0 and out["timing/update/min"] == 2.0
    assert out["tokens/update/max"] == 12.0
