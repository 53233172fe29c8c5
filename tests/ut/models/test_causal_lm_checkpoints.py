"""What the engine's checkpoints hold: weights-only DCP checkpoints, the optimizer coming back as saved,
an untrainable engine's checkpoint, the gathered HF export of an FSDP engine, and the RNG a seeded
generate forks."""
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from transformers import Qwen2ForCausalLM

from mindspeed_rl.models import causal_lm, sharding
from mindspeed_rl.models.causal_lm import CausalLMEngine
from ut.models.engine_cases import engine_data, linear_loss_fn, small_qwen2_dir
from ut.models.rank_threads import SerialLoads, run_ranks

# a single-process DCP save / load says it runs without torch.distributed
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return small_qwen2_dir(tmp_path_factory, "tiny_qwen2_checkpoints")


def _engine(model_dir, **kwargs):
    return CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, **kwargs)


def _weights(engine):
    return {n: sharding.local(p).detach().clone() for n, p in engine.module.named_parameters()}


def _trained(model_dir, lr=1e-2):
    engine = _engine(model_dir, lr=lr)
    prompts, responses = engine_data(3)
    engine.train_step(prompts, responses, [[0, 1, 2]], linear_loss_fn([0, 1, 2]), sum(r.numel() for r in responses))
    return engine


def _saved_keys(path):
    return set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def test_weights_only_checkpoint_holds_and_restores_no_optimizer(model_dir, tmp_path):
    engine = _trained(model_dir)
    engine.save_sharded(str(tmp_path / "w"), with_optimizer=False)
    keys = _saved_keys(tmp_path / "w")
    assert keys and all(k.startswith("model.") for k in keys), sorted(keys)[:5]
    other = _engine(model_dir, lr=1e-3)
    other.load_sharded(str(tmp_path / "w"), with_optimizer=False)
    for name, w in _weights(engine).items():
        torch.testing.assert_close(_weights(other)[name], w, atol=0, rtol=0, msg=name)
    assert not other.optimizer.state and other.optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    # asking for the optimizer from a weights-only checkpoint is refused
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: optim"):
        _engine(model_dir).load_sharded(str(tmp_path / "w"))


def test_full_checkpoint_restores_the_optimizer_as_saved(model_dir, tmp_path):
    engine = _trained(model_dir, lr=1e-2)
    engine.save_sharded(str(tmp_path / "full"))
    assert any(k.startswith("optim.") for k in _saved_keys(tmp_path / "full"))
    other = _engine(model_dir, lr=1e-3)
    other.load_sharded(str(tmp_path / "full"))
    # the saved hyper-parameters and moments, not the ones the new engine was built with
    assert other.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)
    saved = engine.optimizer.state_dict()["state"]
    loaded = other.optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for key in saved:
        for moment in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(loaded[key][moment], saved[key][moment], atol=0, rtol=0)


def test_untrainable_engine_saves_and_loads_its_weights(model_dir, tmp_path):
    trained = _trained(model_dir)
    trained.save_sharded(str(tmp_path / "trained"), with_optimizer=False)
    reference = _engine(model_dir, trainable=False)
    reference.load_sharded(str(tmp_path / "trained"))  # with_optimizer is moot without an optimizer
    for name, w in _weights(trained).items():
        torch.testing.assert_close(_weights(reference)[name], w, atol=0, rtol=0, msg=name)
    reference.save_sharded(str(tmp_path / "again"))
    assert all(k.startswith("model.") for k in _saved_keys(tmp_path / "again"))


def _fsdp_save(rank, model_dir, path):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, lr=1e-2, seed=0,
                            mesh=sharding.build_mesh("cpu", 2, 1), fsdp=True)
    engine.save(path)  # every rank calls it, rank 0 writes the gathered weights


def test_fsdp_engine_saves_the_gathered_model_from_rank_zero(model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(causal_lm, "AutoModelForCausalLM", SerialLoads(causal_lm.AutoModelForCausalLM))
    path = str(tmp_path / "hf")
    run_ranks(2, _fsdp_save, model_dir, path)
    saved = Qwen2ForCausalLM.from_pretrained(path).state_dict()
    original = Qwen2ForCausalLM.from_pretrained(model_dir).state_dict()
    assert saved.keys() == original.keys()
    for name, w in original.items():
        assert type(saved[name]) is torch.Tensor
        torch.testing.assert_close(saved[name], w, atol=0, rtol=0, msg=name)


@pytest.mark.parametrize("device,forked", [("cpu", []), ("cuda", [0]), ("cuda:1", [1])])
def test_seeded_generate_forks_the_rng_of_its_own_device(model_dir, monkeypatch, device, forked):
    # the engine forks only its device's generator (a CPU engine: no accelerator generator at all);
    # the device is set after loading, so this runs without an accelerator
    calls = []
    monkeypatch.setattr(torch.random, "fork_rng", lambda **kwargs: calls.append(kwargs))
    engine = _engine(model_dir, trainable=False)
    engine.device = torch.device(device)
    engine._fork_rng()
    want = {"devices": forked} if device == "cpu" else {"devices": forked, "device_type": "cuda"}
    assert calls == [want]
