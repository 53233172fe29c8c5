"""WorkerSpec: what a worker reads of the configs travels in the run plan as plain values;
the config objects never leave the driver."""
import dataclasses
import pickle
from pathlib import Path

import pytest
import torch

import mindspeed_rl.workers.engine_worker as engine_worker
import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.config_cls.generate_config import GenerateConfig
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.config_cls.rl_config import RLConfig
from mindspeed_rl.plan.run_plan import Layout, RunPlan
from mindspeed_rl.plan.stages import OLD, REF, TRAIN
from mindspeed_rl.plan.worker_spec import worker_spec
from mindspeed_rl.workers.parallel_state import ParallelState
from mindspeed_rl.workers.scheduler import launcher

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"
CONFIG_TYPES = (MegatronConfig, RLConfig, GenerateConfig)


def _configs(*overrides):
    return build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides]))


class Engine:
    """Stands in for CausalLMEngine: keeps its constructor kwargs and the micro-batches it is given."""

    def __init__(self, *args, **kwargs):
        self.kwargs = kwargs
        self.parts = []

    def log_probs(self, prompts, responses, micro_batches, temperature=1.0):
        self.parts.append((micro_batches, temperature))
        return [torch.zeros(r.numel()) for r in responses], None


def _workers(monkeypatch, cfgs, seeds=None):
    monkeypatch.setattr(iw, "CausalLMEngine", Engine)
    monkeypatch.setattr(engine_worker, "seed_all", lambda seed, deterministic: (seeds if seeds is not None else []).append(seed))
    plan = cfgs.plan
    workers = []
    for rank in range(plan.layout.world_size):
        w = iw.IntegratedWorker(rank=rank, world_size=plan.layout.world_size, run_plan=plan)
        w.parallel_state = ParallelState.from_layout(rank, plan.layout)
        w.initialize("/unused", eos_id=13, pad_id=14)
        workers.append(w)
    return workers


OVERRIDES = ["actor_config.lr=0.0125", "actor_config.min_lr=0.001", "actor_config.adam_beta2=0.95",
             "megatron_training.seed=77", "rl_config.seed=5", "generate_config.sampling_config.temperature=0.5",
             "generate_config.sampling_config.seed=9", "generate_config.sampling_config.top_k=7",
             "rl_config.use_dynamic_bsz=false", "rl_config.actor_forward_micro_batch_size=3",
             "rl_config.ref_forward_micro_batch_size=1", "actor_config.micro_batch_size=1",
             "rl_config.clip_higher_enable=true", "rl_config.clip_ratio_low=0.15", "rl_config.clip_ratio_high=0.3",
             "rl_config.entropy_coeff=0.01", "rl_config.placement_strategy=SPREAD",
             "rl_config.mini_batch_size=8", "rl_config.epochs=2"]


def test_spec_carries_the_configured_values():
    cfgs = _configs(*OVERRIDES)
    spec, plan = cfgs.plan.worker, cfgs.plan
    assert spec.optimizer.lr == 0.0125 and spec.optimizer.min_lr == 0.001
    assert spec.optimizer.betas == (0.9, 0.95) and spec.optimizer.lr_decay_style == "constant"
    assert spec.engine.seed == 77 and plan.seed == 5  # megatron's seed in the spec, the RL seed in the plan only
    assert spec.engine.distributed_backend == "gloo" and spec.engine.use_remove_padding is True
    assert (spec.sampling.temperature, spec.sampling.seed, spec.sampling.top_k, spec.sampling.max_tokens) == (0.5, 9, 7, 10)
    assert spec.micro_batches.use_dynamic_bsz is False
    assert spec.micro_batches.size(OLD.micro_batch_key) == 3 and spec.micro_batches.size(REF.micro_batch_key) == 1
    assert spec.micro_batches.size(TRAIN.micro_batch_key) == 1
    assert (spec.loss.clip_ratio_low, spec.loss.clip_ratio_high, spec.loss.entropy_coeff) == (0.15, 0.3, 0.01)
    assert plan.placement == "SPREAD"
    # DAPO's bounds apply only with clip_higher_enable
    off = _configs("rl_config.clip_ratio_low=0.15").plan.worker.loss
    assert (off.clip_ratio_low, off.clip_ratio_high) == (None, None)
    with pytest.raises(KeyError, match="no micro-batch size 'nope'"):
        spec.micro_batches.size("nope")


def test_worker_behaviour_follows_the_spec(monkeypatch):
    cfgs = _configs(*OVERRIDES)
    seeds = []
    w0, w1 = _workers(monkeypatch, cfgs, seeds)
    assert seeds == [77, 78]  # megatron_training.seed + rank
    assert w0._temperature() == 0.5
    kw = w0.actor.kwargs
    assert (kw["lr"], kw["betas"], kw["seed"], kw["trust_remote_code"]) == (0.0125, (0.9, 0.95), 5, False)
    assert w0._lr_schedule().keywords["base_lr"] == 0.0125 and w0._lr_schedule().keywords["min_lr"] == 0.001
    # the old log-prob stage cuts micro-batches of actor_forward_micro_batch_size rows, at the sampling temperature
    batch = {"prompts": [torch.ones(2, dtype=torch.long)] * 6, "responses": [torch.ones(3, dtype=torch.long)] * 6,
             "prompt_length": [torch.tensor([2])] * 6, "response_length": [torch.tensor([3])] * 6}
    w0.compute_log_prob([batch])
    parts, temperature = w0.actor.parts[-1]
    assert [len(p) for p in parts] == [3, 3] and temperature == 0.5


def test_default_temperature_when_sampling_is_greedy(monkeypatch):
    (w0, _) = _workers(monkeypatch, _configs("generate_config.sampling_config.temperature=0.0"))
    assert w0._temperature() == 1.0


def test_no_config_object_reaches_a_worker(monkeypatch):
    cfgs = _configs()
    for w in _workers(monkeypatch, cfgs):
        values = list(vars(w).values())
        assert not [v for v in values if isinstance(v, CONFIG_TYPES)]
    plan = cfgs.plan
    with pytest.raises(TypeError, match=r"no config objects \(got \['rl_config'\]\)"):
        iw.IntegratedWorker(rank=0, world_size=plan.layout.world_size, run_plan=plan, rl_config=cfgs.rl_config)
    with pytest.raises(ValueError, match="needs the run_plan"):
        iw.IntegratedWorker(rank=0, world_size=2, run_plan=None)


def _plain(value) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return dataclasses.is_dataclass(value) and all(_plain(getattr(value, f.name)) for f in dataclasses.fields(value))


def test_spec_is_plain_values_and_pickles_small():
    cfgs = _configs(*OVERRIDES)
    spec = cfgs.plan.worker
    assert _plain(spec)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.optimizer.lr = 1.0
    data = pickle.dumps(spec)
    assert pickle.loads(data) == spec
    assert len(data) < 2000, len(data)
    plan_bytes = pickle.dumps(cfgs.plan)  # what the launcher sends each rank
    for name in (b"megatron_config", b"rl_config", b"generate_config"):
        assert b"mindspeed_rl.config_cls." + name not in plan_bytes


def test_hand_built_plan_gets_the_config_defaults():
    plan = RunPlan(Layout(1, 1, 1), prompts_per_round=1, n_samples=1, mini_batch_rows=1, epochs=1, train_iters=1)
    # a plan built by hand rolls out with the HF backend (no engine to start)
    assert plan.worker == worker_spec(MegatronConfig({}, {}), RLConfig({}), GenerateConfig({"rollout_backend": "hf"}))
    assert plan.worker.rollout.backend == "hf"
    assert plan.worker.engine.distributed_backend == "nccl" and plan.placement == "auto"


@pytest.mark.parametrize("override, field", [
    ("rl_config.actor_forward_micro_batch_size=0", "rl_config.actor_forward_micro_batch_size=0 must be an int > 0"),
    # a wrong type is refused by the one type check of every section (config_cls/key_types.py)
    ("generate_config.sampling_config.seed=abc", "generate_config.sampling_config.seed expects int, got 'abc'"),
])
def test_bad_spec_value_names_the_field(override, field):
    with pytest.raises((ValueError, TypeError), match=field.replace("(", r"\(")):
        _configs(override)


def test_launcher_places_by_the_plans_strategy(monkeypatch):
    """The launcher reads the placement strategy from the run plan (no Ray: placement is stubbed)."""
    cfgs = _configs("rl_config.placement_strategy=STRICT_SPREAD")
    seen = []

    def place(bundle, count, strategy, timeout, custom=False):
        seen.append((count, strategy))
        raise launcher.PlacementError("stop here")

    monkeypatch.setattr(launcher, "_accelerator", lambda: None)
    monkeypatch.setattr(launcher, "_nodes", lambda: [])
    monkeypatch.setattr(launcher, "_place", place)
    with pytest.raises(launcher.PlacementError, match="stop here"):
        launcher.RayActorGroup(iw.IntegratedWorker, cfgs.plan)
    assert seen == [(2, "STRICT_SPREAD")]
