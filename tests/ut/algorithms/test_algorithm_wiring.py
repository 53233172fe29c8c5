"""The algorithm keys reach the functions that run: rl_config.adv_estimator picks the advantage stage's
estimator, loss_mode the actor's policy loss, loss_agg_mode the mini-batch's denominator (all DP ranks)."""
import pytest
import torch

import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.algorithms import ADV_ESTIMATORS, POLICY_LOSSES
from mindspeed_rl.plan.loader import build_configs, load_config
from mindspeed_rl.trainer.stage_trainer import StageTableTrainer
from mindspeed_rl.workers.parallel_state import ParallelState
from ut.dapo.test_dapo_sampling import TINY, Engine, Group, Reward, batches

BASE = ["megatron_training.model_path=/unused", "rl_config.n_samples_per_prompt=4", "rl_config.mini_batch_size=4",
        "actor_config.micro_batch_size=1", "rl_config.init_kl_coef=0.0"]


class LossEngine(Engine):
    """Runs the loss on stand-in log-probs (one micro-batch at a time) and keeps the denominators it was given."""
    counts, micro = [], 0

    def train_step(self, prompts, responses, micro_batches, loss_fn, token_count, dp_size=1, **kwargs):
        LossEngine.counts.append(token_count)
        for mb in micro_batches:
            LossEngine.micro += 1
            lps = [torch.full((responses[i].numel(),), -1.0, requires_grad=True) for i in mb]
            loss, metrics = loss_fn(list(mb), lps, None)
            loss.backward()
        return metrics


def _step(monkeypatch, *overrides):
    monkeypatch.setattr(iw, "CausalLMEngine", LossEngine)
    LossEngine.counts, LossEngine.micro = [], 0
    cfgs = build_configs(load_config(TINY, BASE + list(overrides)))
    plan = cfgs.plan
    workers = []
    for rank in range(plan.layout.world_size):
        w = iw.IntegratedWorker(rank=rank, world_size=plan.layout.world_size, run_plan=plan)
        w.parallel_state = ParallelState.from_layout(rank, plan.layout)
        w.initialize("/unused", eos_id=13, pad_id=14)
        workers.append(w)
    trainer = StageTableTrainer(actor_worker=Group(workers), reward_list=[Reward()], run_plan=plan,
                                dataset_additional_keys=["labels"])
    return plan, trainer.step(1, next(batches()))


def _spy(monkeypatch, registry, name):
    calls, original = [], registry.get(name)

    def spy(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)
    monkeypatch.setitem(registry.functions, registry.canonical(name), spy)
    return calls


@pytest.mark.parametrize("estimator", ["rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo"])
def test_the_configured_estimator_makes_the_advantages(monkeypatch, estimator):
    calls = _spy(monkeypatch, ADV_ESTIMATORS, estimator)
    _step(monkeypatch, f"rl_config.adv_estimator={estimator}")
    assert calls == [estimator]


@pytest.mark.parametrize("mode", ["gspo", "cispo"])
def test_the_configured_policy_loss_runs_in_every_micro_batch(monkeypatch, mode):
    calls = _spy(monkeypatch, POLICY_LOSSES, mode)
    vanilla = _spy(monkeypatch, POLICY_LOSSES, "vanilla")
    _step(monkeypatch, f"rl_config.loss_mode={mode}")
    assert LossEngine.micro > 0 and len(calls) == LossEngine.micro and vanilla == []


@pytest.mark.parametrize("mode, per_row", [("token-mean", None), ("seq-mean-token-mean", 1),
                                           ("seq-mean-token-sum-norm", 7)])
def test_the_denominator_counts_the_whole_mini_batch_by_the_mode(monkeypatch, mode, per_row):
    plan, m = _step(monkeypatch, f"rl_config.loss_agg_mode={mode}", "rl_config.loss_scale_factor=7")
    assert len(LossEngine.counts) == plan.steps_per_iteration * plan.layout.dp
    if per_row is None:  # tokens: more than one per row (responses of 1-7 tokens), the same on every rank
        assert all(c > plan.mini_batch_rows for c in LossEngine.counts)
    else:  # the rank's rows of the mini-batch (in-process the DP all-reduce adds no peer), times the horizon
        assert set(LossEngine.counts) == {float(plan.mini_batch_rows // plan.layout.dp * per_row)}
