"""A stage is one row of the stage table and one function: the plan, the dock's columns, the
dispatch, the balance records and the metrics follow from the row alone (the real trainer step
over two in-process IntegratedWorkers and the driver's dock)."""
import dataclasses
import time
from pathlib import Path

import pytest
import torch

import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.algorithms import DRIVER_STAGES
from mindspeed_rl.plan import build_configs, load_config, stages
from mindspeed_rl.plan.run_plan import PlanError
from mindspeed_rl.plan.stages import GROUP_ADV, REWARD, SEQ_COLUMNS, TRAIN, Stage
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.trainer.utils.compute_utils import put_columns
from mindspeed_rl.workers.parallel_state import ParallelState
from ut.dapo.test_dapo_sampling import Engine, Group, Reward, batches

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"

# a driver stage: a length penalty on the rewards, before the advantages read them
PENALTY = Stage("length_penalty", "driver", "driver", "penalise_length", ("rm_scores", "response_length"),
                ("rm_scores",), phase="rollout")
# a DP stage on the actor's ranks: one number per row, balanced like the other DP stages
PROBE = Stage("actor_probe", "dp", "actor", "probe", SEQ_COLUMNS, ("probe",), balanceable=True)


def penalise_length(trainer, stage):  # the new driver stage's function
    rows = list(range(stage.rows_per_share))
    got = trainer.transfer_dock.get_rows(list(stage.inputs), rows)
    scores = torch.cat([s.reshape(1) for s in got["rm_scores"]])
    lengths = torch.tensor([float(int(n)) for n in got["response_length"]])
    put_columns(trainer.transfer_dock, {"rm_scores": scores - 0.1 * lengths}, rows)
    return {"penalty/mean": float((0.1 * lengths).mean())}


class Worker(iw.IntegratedWorker):
    def probe(self, batches, shares, **_):  # the new DP stage's function
        start = time.perf_counter()
        rows = [r for share in shares for r in share]
        lengths = [int(p) + int(r) for b in batches for p, r in zip(b["prompt_length"], b["response_length"])]
        return self._timing(PROBE.name, start, lengths), {"probe": [torch.tensor([float(r)]) for r in rows]}


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(iw, "CausalLMEngine", Engine)
    monkeypatch.setitem(DRIVER_STAGES.functions, "penalise_length", penalise_length)  # as register_stage does

    def insert(row, before):
        rows = list(stages.STAGES)
        rows.insert(rows.index(before), row)
        monkeypatch.setattr(stages, "STAGES", tuple(rows))
    return insert


def _step():
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused"]))
    plan = cfgs.plan
    workers = []
    for rank in range(plan.layout.world_size):
        w = Worker(rank, plan.layout.world_size, plan)
        w.parallel_state = ParallelState.from_layout(rank, plan.layout)
        w.initialize("/unused", eos_id=13, pad_id=14)
        workers.append(w)
    trainer = RayGRPOTrainer(actor_worker=Group(workers), reward_list=[Reward()], run_plan=plan,
                      dataset_additional_keys=["labels"], init_kl_coef=cfgs.rl_config.init_kl_coef)
    return plan, trainer, trainer.step(1, next(batches()))


def test_a_driver_stage_is_one_row_and_one_function(table):
    table(PENALTY, before=GROUP_ADV)
    plan, trainer, metrics = _step()
    assert list(plan.stages)[1:4] == [REWARD.name, PENALTY.name, GROUP_ADV.name]
    dock = trainer.transfer_dock
    rows = list(range(plan.rows_per_round))
    got = dock.get_rows(["rm_scores", "advantages", "response_length", "responses"], rows)
    raw = torch.tensor([float(r.numel()) for r in got["responses"]])  # Reward(): the length (odd labels) or 1
    scores = torch.cat([s.reshape(1) for s in got["rm_scores"]])
    lengths = torch.tensor([float(int(n)) for n in got["response_length"]])
    assert not torch.allclose(scores, raw) and torch.all(scores <= raw)
    groups = scores.view(-1, plan.n_samples)  # the advantages read the penalised scores
    want = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)
    for a, w, n in zip(got["advantages"], want.reshape(-1), lengths):  # one value on each of the row's tokens
        assert a.numel() == int(n) and torch.allclose(a, w.expand(a.shape), atol=1e-5)
    assert metrics["penalty/mean"] == pytest.approx(float((0.1 * lengths).mean()))


def test_a_dp_stage_is_balanced_and_recorded_without_further_code(table):
    table(PROBE, before=TRAIN)
    plan, trainer, metrics = _step()
    stage = plan.stages[PROBE.name]
    assert stage.is_dp and stage.balanced and stage.shares_per_rank == 1
    dock = trainer.transfer_dock
    assert "probe" in dock.experience_columns  # the dock's columns come from the stages' outputs
    assert bool((dock.experience_data_status["probe"] == 1).all())
    # every row's value came back to its own row, from the rank the round's plan gave it to
    probe = torch.cat([p.reshape(1) for p in dock.get_rows(["probe"], list(range(plan.rows_per_round)))["probe"]])
    assert probe.tolist() == [float(r) for r in range(plan.rows_per_round)]
    assert sorted(r for rank in dock.plan_stage(PROBE.name) for share in rank for r in share) == \
        list(range(plan.rows_per_round))
    for key in (f"timing/{PROBE.name}/max", f"dp_balance/{PROBE.name}/rank_imbalance",
                f"dp_balance/{PROBE.name}/imbalance"):
        assert key in metrics


def test_a_row_on_a_role_without_a_worker_group_is_refused(table):
    table(dataclasses.replace(PROBE, role="judge"), before=TRAIN)
    with pytest.raises(PlanError, match="stage 'actor_probe' runs on role 'judge', which has no worker group"):
        build_configs(load_config(TINY, ["megatron_training.model_path=/unused"]))


def test_a_critic_stage_without_a_critic_group_is_refused():
    cfgs = build_configs(load_config(TINY.parent / "ppo_tiny_cpu.yaml", ["megatron_training.model_path=/unused"]))
    with pytest.raises(ValueError, match="stage 'critic_compute_values' of the run plan runs on role 'critic'"):
        RayGRPOTrainer(actor_worker=object(), reward_list=[Reward()], run_plan=cfgs.plan)
