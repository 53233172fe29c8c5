"""The async modes' rollout engine in this process (a tiny Qwen2, no process group): a whole model without an
optimizer, weight versions loaded from the trainer's full state (a bad one refused before anything changes), and
its samples follow the weights it holds; the integrated worker's full state for it."""
from pathlib import Path

import pytest
import torch

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.models.tiny_model import build_tiny_checkpoint
from mindspeed_rl.workers.integrated_worker import IntegratedWorker
from mindspeed_rl.workers.parallel_state import ParallelState
from mindspeed_rl.workers.rollout_engine import RolloutEngineWorker

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    return str(build_tiny_checkpoint(root / "a", seed=0)), str(build_tiny_checkpoint(root / "b", seed=1))


def _plan():
    return build_configs(load_config(TINY, ["megatron_training.model_path=/unused",
                                            "rl_config.trainer_mode=separate_async"])).plan


def _worker(cls, plan, path, rank=0):
    worker = cls(rank=rank, world_size=plan.layout.world_size, run_plan=plan)
    worker.parallel_state = ParallelState.from_layout(rank, plan.layout)
    worker.initialize(path, 0, 0)
    return worker


def _sample(worker):
    prompts = [torch.tensor([3, 4, 5], dtype=torch.int32), torch.tensor([6, 7], dtype=torch.int32)]
    return worker.rollout.generate(prompts, worker.run_plan.worker.sampling, [11, 12], None, 0).responses


def test_an_engine_holds_a_whole_model_and_samples_with_the_version_it_was_given(models):
    plan = _plan().for_group("rollout")
    a, b = models
    engine = _worker(RolloutEngineWorker, plan, a)
    assert engine.actor.optimizer is None and engine.ref is None and engine.weight_version() == 0
    assert not any(p.requires_grad for p in engine.actor.module.parameters())
    first = _sample(engine)
    other = _worker(RolloutEngineWorker, plan, b)
    state = {k: v.clone() for k, v in other.actor.module.state_dict().items()}
    assert engine.load_weights(state, 3) == 3 == engine.weight_version()
    for name, value in engine.actor.module.state_dict().items():
        assert torch.equal(value, state[name]), name
    assert [t.tolist() for t in _sample(engine)] == [t.tolist() for t in _sample(other)]
    assert [t.tolist() for t in first] != [t.tolist() for t in _sample(engine)]
    # a checkpoint holds nothing of an engine: the driver keeps its weights
    assert engine.save_checkpoint("/nowhere") == "/nowhere" and engine.load_checkpoint("/nowhere", 5) == 5


def test_weights_that_do_not_fit_are_refused_before_anything_loads(models):
    plan = _plan().for_group("rollout")
    engine = _worker(RolloutEngineWorker, plan, models[0])
    before = {k: v.clone() for k, v in engine.actor.module.state_dict().items()}
    name = next(k for k in before if k.endswith("q_proj.weight"))
    cases = [
        ({**before, "extra.weight": torch.zeros(1)}, r"unexpected \['extra.weight'\]"),
        ({k: v for k, v in before.items() if k != name}, rf"missing \['{name}'\]"),
        ({**{k: torch.zeros_like(v) for k, v in before.items()}, name: torch.zeros(1)}, rf"other shapes \['{name}'\]"),
    ]
    for state, what in cases:
        with pytest.raises(ValueError, match=rf"^rollout engine 0: weight version 2 does not fit the model \(.*{what}"
                                             rf".*\); it keeps version 0$"):
            engine.load_weights(state, 2)
        assert engine.weight_version() == 0
        for key, value in engine.actor.module.state_dict().items():
            assert torch.equal(value, before[key]), key


def test_the_trainer_gives_its_full_weights_from_rank_0_only(models):
    plan = _plan()
    ranks = [_worker(IntegratedWorker, plan, models[0], rank=r) for r in range(plan.layout.world_size)]
    state = ranks[0].policy_state()
    assert all(r.policy_state() is None for r in ranks[1:])
    own = ranks[0].actor.module.state_dict()
    assert set(state) == set(own) and all(v.device.type == "cpu" for v in state.values())
    name = next(iter(state))
    state[name].add_(1.0)  # a copy: what the engines get cannot change the trainer's weights
    assert not torch.equal(state[name], own[name])


def test_a_state_without_the_tied_head_loads_and_the_head_follows_the_embeddings(models):
    plan = _plan().for_group("rollout")
    engine = _worker(RolloutEngineWorker, plan, models[0])
    other = _worker(RolloutEngineWorker, plan, models[1])
    state = {k: v.clone() for k, v in other.actor.module.state_dict().items() if not k.endswith("lm_head.weight")}
    assert len(state) < len(other.actor.module.state_dict())  # the tiny model ties its head to its embeddings
    assert engine.load_weights(state, 1) == 1
    module = engine.actor.module
    assert torch.equal(module.get_output_embeddings().weight, module.get_input_embeddings().weight)
    assert torch.equal(module.get_input_embeddings().weight, other.actor.module.get_input_embeddings().weight)
