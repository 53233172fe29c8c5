"""DP stages whose plans coincide run in one call per rank: the real trainer step over two in-process
IntegratedWorkers (DP ranks 0 and 1, no process group) and the driver's dock."""
import pickle
from pathlib import Path

import pytest
import torch

import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import OLD, REF, REWARD, ROLLOUT, TRAIN
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.workers.parallel_state import ParallelState
from ut.dapo.test_dapo_sampling import Engine, Group, Reward, batches

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"


class CountingGroup(Group):
    """Records what each group call ran: the names of the stages run together."""

    def __init__(self, workers):
        super().__init__(workers)
        self.calls = []

    def run_stage(self, group, plan, batches, **context):
        self.calls.append(group.names)
        return super().run_stage(group, plan, batches, **context)

    def run_queued_stage(self, group, queued, **context):
        self.calls.append(group.names)
        return super().run_queued_stage(group, queued, **context)


def _step(*overrides):
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides]))
    plan = cfgs.plan
    assert REF.name in plan.stages and OLD.name in plan.stages  # both log-prob stages run in this config
    workers = []
    for rank in range(plan.layout.world_size):
        w = iw.IntegratedWorker(rank, plan.layout.world_size, plan)
        w.parallel_state = ParallelState.from_layout(rank, plan.layout)
        w.initialize("/unused", eos_id=13, pad_id=14)
        workers.append(w)
    group = CountingGroup(workers)
    trainer = RayGRPOTrainer(actor_worker=group, reward_list=[Reward()], run_plan=plan,
                             dataset_additional_keys=["labels"], init_kl_coef=cfgs.rl_config.init_kl_coef)
    metrics = trainer.step(1, next(batches()))
    return group.calls, metrics, trainer.transfer_dock


@pytest.fixture(autouse=True)
def engine(monkeypatch):
    monkeypatch.setattr(iw, "CausalLMEngine", Engine)


def test_reference_and_old_log_probs_run_in_one_call_when_their_plans_coincide():
    calls, metrics, dock = _step()
    assert calls == [(ROLLOUT.name,), (REF.name, OLD.name), (TRAIN.name,)]
    for column in (REF.outputs[0], OLD.outputs[0]):  # both written for every row of the round
        assert bool((dock.experience_data_status[column] == 1).all())
    for stage in (REF.name, OLD.name):  # each stage keeps its own timing and balance record
        assert f"timing/{stage}/max" in metrics and f"dp_balance/{stage}/imbalance" in metrics
    assert dock.plan_stage(REF.name) == dock.plan_stage(OLD.name)


def test_stages_with_different_plans_run_apart():
    # balance off: each stage gets its own seeded random split, so the plans differ
    calls, metrics, dock = _step("rl_config.use_dp_batch_balance=false")
    assert dock.plan_stage(REF.name) != dock.plan_stage(OLD.name)
    assert calls == [(ROLLOUT.name,), (REF.name,), (OLD.name,), (TRAIN.name,)]
    assert bool((dock.experience_data_status[OLD.outputs[0]] == 1).all())


def test_the_dock_refuses_to_run_stages_with_different_plans_together():
    _, _, dock = _step("rl_config.use_dp_batch_balance=false")
    stages = dock.run_plan.stages
    both = StageGroup.of(stages[REF.name], stages[OLD.name])
    with pytest.raises(ValueError, match=rf"cannot run together: '{OLD.name}' has another plan"):
        dock.dispatch(both)
    with pytest.raises(ValueError, match="cannot run together"):
        dock.put_stage(both, {}, {})
    plan, *rows = dock.dispatch(StageGroup.of(stages[REF.name]))
    assert all(set(r) == set(stages[REF.name].inputs) for r in rows)


def test_a_stage_group_holds_dp_stages():
    cfgs = build_configs(load_config(TINY, ["megatron_training.model_path=/unused"]))
    stages = cfgs.plan.stages
    group = StageGroup.of(stages[REF.name], stages[OLD.name])
    assert group.name == f"{REF.name}+{OLD.name}" and group.names == (REF.name, OLD.name)
    assert group.inputs == stages[REF.name].inputs and group.outputs == REF.outputs + OLD.outputs
    with pytest.raises(ValueError, match="not DP stages"):
        StageGroup.of(stages[REWARD.name])
    with pytest.raises(ValueError, match="at least one stage"):
        StageGroup(())
    # to the ranks it travels as names and columns (every call, every rank), not whole StagePlans
    wire = pickle.dumps(group)
    back = pickle.loads(wire)
    assert (back.names, back.inputs, back.outputs) == (group.names, group.inputs, group.outputs)
    assert len(wire) < len(pickle.dumps(group.stages)) / 2


@pytest.mark.parametrize("bad", ["short", "columns"])
def test_a_stage_write_is_all_or_nothing_when_one_rank_is_bad(bad):
    _, _, dock = _step("rl_config.use_dp_batch_balance=false")
    stage = dock.run_plan.stages[OLD.name]
    column = OLD.outputs[0]
    group = StageGroup.of(stage)
    plan, *_ = dock.dispatch(group)
    dock.experience_data_status[column].zero_()  # as before the stage ran
    before = [t.clone() for t in dock.experience_data[column]]
    lengths = dock.experience_lengths["response_length"]
    outputs = [{column: [torch.full((int(lengths[r]),), -7.0) for share in shares for r in share]}
               for shares in plan]
    if bad == "short":
        outputs[1][column] = outputs[1][column][:-1]
    else:
        outputs[1] = {"log_prob": outputs[1][column]}
    with pytest.raises(ValueError, match=rf"put_stage\('{OLD.name}'\): rank 1"):
        dock.put_stage(group, *outputs)
    assert not bool(dock.experience_data_status[column].any())  # rank 0's rows were not written either
    assert all(torch.equal(a, b) for a, b in zip(before, dock.experience_data[column]))
    dock.put_stage(group, outputs[0], {column: [torch.full((int(lengths[r]),), -7.0)
                                                for share in plan[1] for r in share]})
    assert bool((dock.experience_data_status[column] == 1).all())
