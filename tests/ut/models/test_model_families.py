"""Every model family (transformers' own classes) through the sharded engine against one process.

One spawn of 4 gloo processes serves every check: per family, rank 0 runs the
single-process reference, then all ranks run TP2 x DP2 (FSDP) and FSDP DP=2
(ranks {0,1} and {2,3} as two independent pairs). Gradients, the next step's
weights and packed log-probs must equal the reference, and each rank's
parameter bytes must equal the memory plan's count (sharding.tp_plan of a
meta-device model of the same config). Also: FSDP reduces gradients in fp32
when compute is bf16.

A family that fails fails only its own tests: each rank catches a family's
error, saves it as that family's result and goes on with the next family (a
deliberately broken family runs first to hold the spawn to it).
"""
import os
import time
import traceback

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
BROKEN = "broken"  # a model folder that does not exist: every rank fails to load it
N = 8
WORLD = 4
HANG_GUARD_S = 1800  # only ends a spawn whose ranks wait on each other forever


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


def _family(rank, model_dir, tp_mesh, fsdp_mesh):
    out = {}
    if rank == 0:
        out["single"] = _run(_engine(model_dir), 1, 0)
    res = _run(_engine(model_dir, tp_mesh, fsdp=True), 2, rank // 2)
    res["planned"] = _planned_bytes(model_dir, 2, 2, rank // 2, rank % 2, True)
    out["tp2dp2"] = res
    res = _run(_engine(model_dir, fsdp_mesh, fsdp=True), 2, rank % 2)
    res["planned"] = _planned_bytes(model_dir, 2, 1, rank % 2, 0, True)
    out["fsdp2"] = res
    return out


def each_saved(jobs, save):
    """Run each ``name -> fn`` and ``save(name, result)`` at once; an error is saved as that
    job's result ({"error": traceback}) and the next job runs."""
    for name, fn in jobs.items():
        try:
            result = fn()
        except Exception:  # noqa: BLE001 - kept as this job's result
            result = {"error": traceback.format_exc()}
        save(name, result)


def _worker(rank, init_file, model_dirs, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        tp_mesh = sharding.build_mesh("cpu", 2, 2)  # TP2 x DP2
        pairs = dist.device_mesh.init_device_mesh("cpu", (2, 2), mesh_dim_names=("pair", "dp"))
        fsdp_mesh = pairs["dp"]  # FSDP DP=2 within ranks {0,1} and {2,3}
        jobs = {f: (lambda d=d: _family(rank, d, tp_mesh, fsdp_mesh)) for f, d in model_dirs.items()}
        jobs["reduce_dtypes"] = lambda: _reduce_dtypes(model_dirs["qwen3"], fsdp_mesh, rank % 2)
        each_saved(jobs, lambda name, res: torch.save(res, os.path.join(out_dir, f"{name}.rank{rank}.pt")))
    finally:
        dist.destroy_process_group()


def load_results(out_dir, names, lost):
    """name -> the list of every rank's result, or {"error": ...}: a rank's own error, or
    ``lost`` (why the spawn ended) where a rank left no result."""
    out = {}
    for name in names:
        paths = [os.path.join(out_dir, f"{name}.rank{r}.pt") for r in range(WORLD)]
        if not all(os.path.exists(p) for p in paths):
            out[name] = {"error": f"{name}: no result from every rank; {lost}"}
            continue
        got = [torch.load(p) for p in paths]
        errors = [f"rank {r}: {g['error']}" for r, g in enumerate(got) if isinstance(g, dict) and "error" in g]
        out[name] = {"error": "\n".join(errors)} if errors else got
    return out


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
    model_dirs = {BROKEN: str(root / "missing")}
    model_dirs.update({f: build_tiny_checkpoint(root / f, seed=0, model_type=f) for f in FAMILIES})
    ctx = mp.start_processes(_worker, args=(str(root / "init"), model_dirs, str(root)), nprocs=WORLD,
                             join=False, start_method="spawn")
    lost, deadline = "the spawn ended early", time.monotonic() + HANG_GUARD_S
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                lost = f"the ranks were still running after {HANG_GUARD_S}s (a rank waits on another)"
                break
    except Exception as err:  # noqa: BLE001 - a rank died: what it saved before still counts
        lost = f"a rank died: {err}"
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.terminate()
    return load_results(str(root), list(model_dirs) + ["reduce_dtypes"], lost)


def _ok(results, name):
    got = results[name]
    if isinstance(got, dict):
        pytest.fail(f"{name} failed in the spawned ranks:\n{got['error']}", pytrace=False)
    return got


def _max_diff(a, b):
    return max(float((x - y).abs().max()) if x.numel() else 0.0 for x, y in zip(a, b))


@pytest.mark.parametrize("layout", ["tp2dp2", "fsdp2"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_layout_matches_single_process(results, family, layout):
    ranks = _ok(results, family)
    ref = ranks[0]["single"]
    errors = {"grads": 0.0, "weights": 0.0, "log_probs": 0.0}
    for rank, got in enumerate(ranks):
        res = got[layout]
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
    for seen in _ok(results, "reduce_dtypes"):
        assert ("compute_dtype", torch.bfloat16) in seen
        reduced = [d for d in seen if isinstance(d, torch.dtype)]
        assert reduced and all(d == torch.float32 for d in reduced), reduced


def test_a_broken_family_fails_only_itself(results):
    # the broken family ran first on every rank; the families after it still ran
    assert "error" in results[BROKEN] and "missing" in results[BROKEN]["error"]
    for name in FAMILIES + ("reduce_dtypes",):
        got = results[name]
        assert not isinstance(got, dict) or "no result from every rank" not in got["error"], (name, got)


def test_each_saved_keeps_going_after_an_error():
    saved = {}

    def boom():
        raise RuntimeError("boom")
    each_saved({"a": boom, "b": lambda: 2}, saved.__setitem__)
    assert "RuntimeError: boom" in saved["a"]["error"] and saved["b"] == 2


def test_load_results_gives_each_name_its_own_entry(tmp_path):
    for r in range(WORLD):
        torch.save({"x": r}, tmp_path / f"good.rank{r}.pt")
        torch.save({"error": "Traceback: bad"} if r == 1 else {"x": r}, tmp_path / f"bad.rank{r}.pt")
    torch.save({"x": 0}, tmp_path / "lost.rank0.pt")
    got = load_results(str(tmp_path), ["good", "bad", "lost"], "a rank died: oops")
    assert got["good"] == [{"x": r} for r in range(WORLD)]
    assert got["bad"] == {"error": "rank 1: Traceback: bad"}
    assert got["lost"] == {"error": "lost: no result from every rank; a rank died: oops"}
