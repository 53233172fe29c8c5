"""The sharded engine (DTensor TP over the mesh's tp dim, FSDP2 over dp) against a single process.

Each layout runs in gloo processes on CPU; every rank gets its DP share of the
same samples (TP peers the same share). Gradients, the next step's weights,
packed log-probs and greedy generation must equal the unsharded engine's, and
each rank must hold about 1/(dp x tp) of the model and optimizer state.
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import Qwen2Config, Qwen2ForCausalLM

from mindspeed_rl.models import sharding
from mindspeed_rl.models import causal_lm
from mindspeed_rl.models.causal_lm import CausalLMEngine
from ut.models.engine_cases import engine_data, linear_loss_fn
from ut.models.rank_threads import SerialLoads, run_ranks

N = 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cfg = Qwen2Config(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True,
                      max_position_embeddings=64)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_qwen2_sharded")
    Qwen2ForCausalLM(cfg).save_pretrained(str(path))
    return str(path)


def _engine(model_dir, mesh=None, fsdp=False):
    # a large Adam eps keeps the first update linear in the gradient, so float noise in
    # near-zero gradients cannot flip an update's sign
    return CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, lr=1e-2, eps=1e-2, seed=0,
                          mesh=mesh, fsdp=fsdp)


def _full_grads(engine):
    out = {}
    for name, p in engine.module.named_parameters():
        g = p.grad
        out[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return out


def _rank_result(rank, dp, tp, fsdp, model_dir):
    """What one rank of a (dp, tp) layout computes on its DP share: gradients, weights, sizes, log-probs."""
    mesh = sharding.build_mesh("cpu", dp, tp)
    dp_rank = rank // tp
    prompts, responses = engine_data(N)
    tokens = sum(r.numel() for r in responses)
    mine = list(range(dp_rank, N, dp))  # this DP rank's samples
    engine = _engine(model_dir, mesh, fsdp)
    p_local = [prompts[i] for i in mine]
    r_local = [responses[i] for i in mine]
    micro = [[0, 1], list(range(2, len(mine)))]
    engine.compute_grads(p_local, r_local, micro, linear_loss_fn(mine), tokens, dp_size=dp, with_entropy=False)
    grads = _full_grads(engine)
    metrics = engine.train_step(p_local, r_local, micro, linear_loss_fn(mine), tokens, dp_size=dp, with_entropy=False)
    weights = engine.state_dict_for_save()
    params = list(engine.module.parameters())
    sizes = {"params": sharding.local_bytes(params),
             "optimizer": sharding.local_bytes(v for state in engine.optimizer.state.values() for v in state.values()
                                                  if torch.is_tensor(v) and v.dim() > 0),
             "planned": 4 * sum(sharding.planned_local_numel(n, tuple(p.shape), dp, tp, dp_rank, rank % tp, fsdp)
                                for n, p in engine.module.named_parameters())}
    log_probs, _ = engine.log_probs(prompts, responses, [[0, 1, 2], [3, 4, 5, 6, 7]])
    greedy = engine.generate(prompts[:3], max_new_tokens=5, temperature=0.0, eos_id=3, pad_id=0)
    return {"grads": grads, "weights": weights, "sizes": sizes, "log_probs": log_probs,
            "greedy": greedy, "grad_norm": metrics["actor/grad_norm"]}


def _worker(rank, world, dp, tp, fsdp, init_file, model_dir, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(_rank_result(rank, dp, tp, fsdp, model_dir), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _reference(model_dir):
    prompts, responses = engine_data(N)
    tokens = sum(r.numel() for r in responses)
    engine = _engine(model_dir)
    everything = list(range(N))
    engine.compute_grads(prompts, responses, [everything], linear_loss_fn(everything), tokens, with_entropy=False)
    grads = {k: v.clone() for k, v in ((n, p.grad) for n, p in engine.module.named_parameters())}
    metrics = engine.train_step(prompts, responses, [everything], linear_loss_fn(everything), tokens, with_entropy=False)
    log_probs, _ = engine.log_probs(prompts, responses, [everything])
    greedy = engine.generate(prompts[:3], max_new_tokens=5, temperature=0.0, eos_id=3, pad_id=0)
    full_bytes = sharding.local_bytes(engine.module.parameters())
    return grads, engine.module.state_dict(), log_probs, greedy, metrics["actor/grad_norm"], full_bytes


def _memory_plan(dp, tp, fsdp):
    """The memory plan of the tiny config (the same model) in this layout."""
    from mindspeed_rl.plan import build_configs, load_config
    from mindspeed_rl.reports.memory_plan import plan_memory
    cfgs = build_configs(load_config("configs/grpo_tiny_cpu.yaml", [
        "megatron_training.model_path=/unused", f"rl_config.actor_resource.num_npus={dp * tp}",
        f"actor_config.tensor_model_parallel_size={tp}", "rl_config.mini_batch_size=2",
        f"megatron_training.use_distributed_optimizer={'true' if fsdp else 'false'}"]))
    return plan_memory(cfgs)


@pytest.fixture(scope="module")
def reference(model_dir):
    return _reference(model_dir)


def _check(ranks, reference, dp, tp, fsdp):
    grads, weights, log_probs, greedy, norm, full_bytes = reference
    for rank, got in enumerate(ranks):
        for name, g in grads.items():
            torch.testing.assert_close(got["grads"][name], g, atol=1e-5, rtol=1e-5, msg=name)
        assert got["grad_norm"] == pytest.approx(norm, rel=1e-5)
        if rank == 0:  # the gathered state dict lands on rank 0, and only there
            assert got["weights"].keys() == weights.keys()
            for name, w in weights.items():
                torch.testing.assert_close(got["weights"][name], w, atol=1e-5, rtol=1e-5, msg=name)
        elif fsdp or tp > 1:
            assert got["weights"] == {}
        for a, b in zip(got["log_probs"], log_probs):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert all(torch.equal(a, b) for a, b in zip(got["greedy"], greedy))
        sizes = got["sizes"]
        # the memory plan's count is what the engine really holds
        assert sizes["params"] == sizes["planned"]
        share = (dp if fsdp else 1) * tp
        # about 1/(dp x tp) of the model (embedding and norms are split over dp only)
        assert sizes["params"] <= full_bytes / share * 1.1
        assert sizes["params"] >= full_bytes / share * 0.95
        assert sizes["optimizer"] == 2 * sizes["params"]  # AdamW's two moments, sharded alike
        if rank == 0:  # the memory plan reports rank 0 (the largest shard)
            planned = _memory_plan(dp, tp, fsdp)
            assert (planned.params, planned.optimizer) == (sizes["params"], sizes["optimizer"])


# real processes: the TP x FSDP layout once over gloo
def test_sharded_layout_matches_single_process(model_dir, reference, tmp_path):
    dp, tp, fsdp = 2, 2, True
    mp.spawn(_worker, args=(dp * tp, dp, tp, fsdp, str(tmp_path / "init"), model_dir, str(tmp_path)),
             nprocs=dp * tp, join=True)
    _check([torch.load(tmp_path / f"rank{r}.pt") for r in range(dp * tp)], reference, dp, tp, fsdp)


# every layout with the ranks as threads of this process (rank_threads.py)
@pytest.mark.parametrize("dp,tp,fsdp", [(1, 2, False), (2, 1, True), (2, 1, False), (2, 2, True), (2, 2, False)])
def test_threaded_layout_matches_single_process(model_dir, reference, dp, tp, fsdp, monkeypatch):
    monkeypatch.setattr(causal_lm, "AutoModelForCausalLM", SerialLoads(causal_lm.AutoModelForCausalLM))
    _check(run_ranks(dp * tp, _rank_result, dp, tp, fsdp, model_dir), reference, dp, tp, fsdp)


def _bf16_rank(rank, model_dir, seen):
    engine = CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, seed=0,
                            mesh=sharding.build_mesh("cpu", 2, 1), fsdp=True, autocast_dtype=torch.bfloat16)
    module = engine.module
    # what a decoder layer and the root (embedding) compute with
    for name, sub in (("layer", module.model.layers[0].self_attn.q_proj), ("root", module.model.embed_tokens)):
        sub.register_forward_hook(lambda mod, inp, out, name=name: seen.append((rank, name, out.dtype)))
    prompts, responses = engine_data(N)
    mine = list(range(rank, N, 2))
    engine.compute_grads([prompts[i] for i in mine], [responses[i] for i in mine], [[0, 1, 2, 3]],
                         linear_loss_fn(mine), sum(r.numel() for r in responses), dp_size=2, with_entropy=False)
    return {p.dtype for p in module.parameters()} | {p.grad.dtype for p in module.parameters()}


def test_threaded_fsdp_computes_in_bf16_and_reduces_gradients_in_fp32(model_dir, monkeypatch):
    monkeypatch.setattr(causal_lm, "AutoModelForCausalLM", SerialLoads(causal_lm.AutoModelForCausalLM))
    seen, reduced = [], []

    def recording(fn):
        def wrapped(*args, **kwargs):
            reduced.append(kwargs.get("input", args[1] if len(args) > 1 else None).dtype)
            return fn(*args, **kwargs)
        return wrapped
    for name in ("reduce_scatter_single", "reduce_scatter_tensor"):  # FSDP2 calls the first
        if hasattr(dist, name):
            monkeypatch.setattr(dist, name, recording(getattr(dist, name)))
    stored = run_ranks(2, _bf16_rank, model_dir, seen)
    assert stored == [{torch.float32}, {torch.float32}]  # master weights and their gradients stay fp32
    assert {(r, name, torch.bfloat16) for r in range(2) for name in ("layer", "root")} == set(seen)
    assert reduced and set(reduced) == {torch.float32}
