"""Every model family (transformers' own classes) through the sharded engine against one process.

One spawn of 4 gloo processes serves every check: per family, rank 0 runs the
single-process reference, then all ranks run TP2 x DP2 (FSDP) and FSDP DP=2
(ranks {0,1} and {2,3} as two independent pairs). Gradients, the next step's
weights and packed log-probs must equal the reference, and each rank's
parameter bytes must equal the memory plan's count (sharding.tp_plan of a
meta-device model of the same config). Also: FSDP reduces gradients in fp32
when compute is bf16.
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoConfig, AutoModelForCausalLM

from mindspeed_rl.models import sharding
from mindspeed_rl.models.causal_lm import CausalLMEngine
from mindspeed_rl.models.tiny_model import build_tiny_checkpoint
from ut.models.engine_cases import engine_data, linear_loss_fn

FAMILIES = ("qwen3", "llama", "qwen3_moe", "deepseek_v3")
N = 8
WORLD = 4


def _engine(model_dir, mesh=None, fsdp=False, autocast_dtype=None):
    # a large Adam eps keeps the first update linear in the gradient (no sign flips from float noise)
    return CausalLMEngine(model_dir, torch.device("cpu"), use_remove_padding=True, lr=1e-2, eps=1e-2, seed=0,
                          mesh=mesh, fsdp=fsdp, autocast_dtype=autocast_dtype)


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _planned_bytes(model_dir, dp, tp, dp_rank, tp_rank, fsdp):
    # the memory plan's rule on a meta-device model of the same config
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    plan = sharding.tp_plan(meta)
    return 4 * sum(sharding.planned_local_numel(n, tuple(p.shape), dp, tp, dp_rank, tp_rank, fsdp, plan=plan)
                   for n, p in meta.named_parameters())


def _run(engine, dp, dp_rank):
    prompts, responses = engine_data(N)
    tokens = sum(r.numel() for r in responses)
    mine = list(range(dp_rank, N, dp))
    p_local, r_local = [prompts[i] for i in mine], [responses[i] for i in mine]
    micro = [[0, 1], list(range(2, len(mine)))] if len(mine) > 2 else [mine and list(range(len(mine)))]
    loss = linear_loss_fn(mine)
    engine.compute_grads(p_local, r_local, micro, loss, tokens, dp_size=dp, with_entropy=False)
    grads = {n: _full(p.grad) for n, p in engine.module.named_parameters()}
    metrics = engine.train_step(p_local, r_local, micro, loss, tokens, dp_size=dp, with_entropy=False)
    weights = engine.state_dict_for_save()
    log_probs, _ = engine.log_probs(prompts, responses, [[0, 1, 2], [3, 4, 5, 6, 7]])
    return {"grads": grads, "weights": weights, "log_probs": log_probs, "grad_norm": metrics["actor/grad_norm"],
            "params": sharding.local_bytes(engine.module.parameters())}


def _worker(rank, init_file, model_dirs, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        tp_mesh = sharding.build_mesh("cpu", 2, 2)  # TP2 x DP2
        pairs = dist.device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("pair", "dp"))
        fsdp_mesh = pairs["dp"]  # FSDP DP=2 within ranks {0,1} and {2,3}
        out = {}
        for family, model_dir in model_dirs.items():
            if rank == 0:
                out[(family, "single")] = _run(_engine(model_dir), 1, 0)
            res = _run(_engine(model_dir, tp_mesh, fsdp=True), 2, rank // 2)
            res["planned"] = _planned_bytes(model_dir, 2, 2, rank // 2, rank % 2, True)
            out[(family, "tp2dp2")] = res
            res = _run(_engine(model_dir, fsdp_mesh, fsdp=True), 2, rank % 2)
            res["planned"] = _planned_bytes(model_dir, 2, 1, rank % 2, 0, True)
            out[(family, "fsdp2")] = res
        out["reduce_dtypes"] = _reduce_dtypes(model_dirs["qwen3"], fsdp_mesh, rank % 2)
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _reduce_dtypes(model_dir, mesh, dp_rank):
    """dtypes of the gradients FSDP reduce-scatters when it computes in bf16."""
    seen = []
    originals = {name: getattr(dist, name) for name in ("reduce_scatter_single", "reduce_scatter_tensor")
                 if hasattr(dist, name)}

    def recorder(fn):
        def wrapped(*args, **kwargs):
            tensor = kwargs.get("input", args[1] if len(args) > 1 else None)
            seen.append(tensor.dtype)
            return fn(*args, **kwargs)
        return wrapped

    engine = _engine(model_dir, mesh, fsdp=True, autocast_dtype=torch.bfloat16)
    # the forward really runs in bf16
    engine.module.model.layers[0].self_attn.q_proj.register_forward_hook(
        lambda mod, inp, out: seen.append(("compute_dtype", out.dtype)))
    for name, fn in originals.items():
        setattr(dist, name, recorder(fn))
    try:
        prompts, responses = engine_data(N)
        engine.compute_grads(prompts[dp_rank::2], responses[dp_rank::2], [[0, 1, 2, 3]], linear_loss_fn(list(range(N))),
                             sum(r.numel() for r in responses), dp_size=2, with_entropy=False)
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
    return seen


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    model_dirs = {f: build_tiny_checkpoint(root / f, seed=0, model_type=f) for f in FAMILIES}
    mp.spawn(_worker, args=(str(root / "init"), model_dirs, str(root)), nprocs=WORLD, join=True)
    return [torch.load(root / f"rank{r}.pt") for r in range(WORLD)]


def _max_diff(a, b):
    return max(float((x - y).abs().max()) if x.numel() else 0.0 for x, y in zip(a, b))


@pytest.mark.parametrize("layout", ["tp2dp2", "fsdp2"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_layout_matches_single_process(results, family, layout):
    ref = results[0][(family, "single")]
    errors = {"grads": 0.0, "weights": 0.0, "log_probs": 0.0}
    for rank, got in enumerate(results):
        res = got[(family, layout)]
        for name, g in ref["grads"].items():
            torch.testing.assert_close(res["grads"][name], g, atol=1e-5, rtol=1e-5, msg=f"{family} {name}")
        errors["grads"] = max(errors["grads"], _max_diff(list(res["grads"].values()), list(ref["grads"].values())))
        assert res["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
        if rank == 0 or res["weights"]:  # the gathered state dict lands on global rank 0
            assert res["weights"].keys() == ref["weights"].keys()
            for name, w in ref["weights"].items():
                torch.testing.assert_close(res["weights"][name], w, atol=1e-5, rtol=1e-5, msg=f"{family} {name}")
            errors["weights"] = max(errors["weights"], _max_diff([res["weights"][k] for k in ref["weights"]],
                                                                 list(ref["weights"].values())))
        for a, b in zip(res["log_probs"], ref["log_probs"]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        errors["log_probs"] = max(errors["log_probs"], _max_diff(res["log_probs"], ref["log_probs"]))
        # the memory plan's count is what the rank really holds
        assert res["params"] == res["planned"], (family, layout, rank)
        assert res["params"] < ref["params"] * 0.6  # really sharded
    print(f"\n{family} {layout} max abs diff: " + ", ".join(f"{k}={v:.2e}" for k, v in errors.items()))


def test_fsdp_reduces_gradients_in_fp32_under_bf16_compute(results):
    for got in results:
        seen = got["reduce_dtypes"]
        assert ("compute_dtype", torch.bfloat16) in seen
        reduced = [d for d in seen if isinstance(d, torch.dtype)]
        assert reduced and all(d == torch.float32 for d in reduced), reduced
