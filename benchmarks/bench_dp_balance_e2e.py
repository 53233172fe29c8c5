"""End-to-end benchmark of DP batch balance: real DP phases, a cost model, scale.

1. Calibration: an in-process ``CausalLMEngine`` (one thread, like a worker)
   times forward and forward+backward of micro-batches of controlled lengths
   and compositions; ``a + b*tokens + c*Q`` is fitted per micro-batch with
   Q = sum of L^2 ("sequence") and Q = tokens^2 ("packed"), scored on a
   held-out third. The better one is used below.
2. Real part: 2 ``IntegratedWorker`` ranks on a local Ray (CPU, gloo), the
   tiny Qwen2 model, the GRPO transfer dock. Rollout is skipped: long-tail
   lengths go into the dock directly, then ``compute_ref_log_prob``,
   ``compute_log_prob`` and ``update`` run with balance on and off on the same
   batch. A worker subclass records each rank's micro-batch lengths, so the
   cost model can predict every rank's phase times.
3. Simulated at scale: the fitted model, k = 8..256 DP ranks, GRPO-like
   long-tail lengths, whole groups split off (random) / heap (the seed's heap
   LPT) / ours (get_seqlen_balanced_partitions); step time / ideal and speed-up.

Prints one report with a TARGETS block; writes JSON and a PNG plot.

Usage:
    python benchmarks/bench_dp_balance_e2e.py [--quick] [--json PATH] [--png PATH] [--seeds N]
"""
import os

# must be set before ray is imported
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

# run from a checkout without installing as well
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mindspeed_rl.balance.cost_model import (CostModel, micro_batch_features, prediction_error,  # noqa: E402
                                           rank_features, simulate_step_time)
from mindspeed_rl.balance.seqlen_balancing import sized_lower_bound  # noqa: E402
from mindspeed_rl.trainer.stage_runner import StageGroup, run_dp_stage  # noqa: E402

CONFIG = ROOT / "configs" / "grpo_tiny_cpu.yaml"
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "dp_balance_e2e.json"
DEFAULT_PNG = ROOT / "benchmarks" / "results" / "dp_balance_e2e.png"

# real part
DP = 2
PROMPTS = 8                 # global batch size (prompts)
N_REAL = 4                  # samples per prompt
REAL_RESPONSE_CAP = 1500    # response tokens
REAL_PROMPT_RANGE = (8, 32)
MAX_PACKING = 4096          # rl_config.max_packing_token_size
KL_COEF = 0.001
STAGES = ("ref_log_prob", "actor_log_prob", "update")
FORWARD_STAGES = ("ref_log_prob", "actor_log_prob")

# simulation
SIM_KS = (8, 32, 128, 256)
SIM_NS = (8, 16)
GROUPS_PER_RANK = 4
SIM_RESPONSE_CAP = 8192
SIM_PROMPT_RANGE = (64, 1024)
SIM_MAX_TOKEN_LEN = 16384   # dynamic micro-batch budget in the simulation
METHODS = ("off", "heap", "ours")

IDEAL_TARGET = 0.03         # ours within 3% of the ideal
SPEEDUP_TARGET = 1.3        # ours vs off


# ---------------------------------------------------------------- lengths


def real_lengths(seed, prompts=PROMPTS, n=N_REAL):
    """Prompt lengths (prompts,) and response lengths (prompts, n): per-prompt
    lognormal difficulty, samples lognormal around it, capped."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(REAL_PROMPT_RANGE[0], REAL_PROMPT_RANGE[1] + 1, size=prompts)
    mu = np.log(250.0) + 1.0 * rng.standard_normal(prompts)
    resp = np.clip(np.rint(rng.lognormal(mu[:, None], 0.5, (prompts, n))), 1, REAL_RESPONSE_CAP).astype(int)
    return prompt, resp


def sim_lengths(seed, prompts, n):
    """Prompt + response tokens per sample (groups consecutive), as in bench_balance."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(SIM_PROMPT_RANGE[0], SIM_PROMPT_RANGE[1] + 1, size=(prompts, 1))
    mu = np.log(1200.0) + 0.8 * rng.standard_normal(prompts)
    resp = np.clip(np.rint(rng.lognormal(mu[:, None], 0.6, (prompts, n))), 1, SIM_RESPONSE_CAP)
    return (prompt + resp).astype(int).reshape(-1)


# ---------------------------------------------------------------- 1. calibration


def calibration_specs(count, seed):
    """Micro-batches: total tokens log-uniform in [32, 4096], split into 1..8
    sequences of at least 12 tokens (so one total comes in many compositions)."""
    rng = np.random.default_rng(seed)
    specs = []
    for _ in range(count):
        total = int(np.exp(rng.uniform(np.log(32), np.log(4096))))
        m = int(min(rng.integers(1, 9), total // 12))
        cuts = np.sort(rng.choice(np.arange(1, total // 12), size=m - 1, replace=False)) * 12 if m > 1 else []
        lens = np.diff(np.concatenate(([0], cuts, [total]))).astype(int)
        specs.append(lens.tolist())
    return specs


def calibrate(model_dir, count, reps, seed):
    """Median seconds of forward and forward+backward per micro-batch spec."""
    import torch
    from mindspeed_rl.models.causal_lm import CausalLMEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker (MSRL_THREADS_PER_WORKER=1)
    try:
        engine = CausalLMEngine(model_dir, device="cpu", use_remove_padding=True, trainable=True, seed=seed)
        gen = torch.Generator().manual_seed(seed)

        def loss_fn(idx, log_probs, entropy):
            return sum(lp.sum() for lp in log_probs), {}

        def run(lens):
            prompts = [torch.randint(0, 32, (8,), generator=gen) for _ in lens]
            responses = [torch.randint(0, 32, (L - 8,), generator=gen) for L in lens]
            mbs = [list(range(len(lens)))]
            t0 = time.perf_counter()
            engine.log_probs(prompts, responses, mbs)
            t1 = time.perf_counter()
            engine.compute_grads(prompts, responses, mbs, loss_fn, token_count=1.0)
            engine.zero_grad()
            return t1 - t0, time.perf_counter() - t1

        for lens in ([512], [256, 256], [2048]):  # warm-up
            run(lens)
        rows = []
        for lens in calibration_specs(count, seed):
            times = np.array([run(lens) for _ in range(reps)])
            fwd, train = np.median(times, axis=0)
            rows.append({"lengths": lens, "forward_s": float(fwd), "train_s": float(train)})
        return rows
    finally:
        torch.set_num_threads(threads)


def fit_calibration(rows, seed):
    """Fit forward / train models in both quadratic modes on two thirds of the
    micro-batches, score on the rest; pick the mode with the lower held-out error."""
    order = np.random.default_rng(seed).permutation(len(rows))
    cut = (2 * len(rows)) // 3
    train_idx, test_idx = order[:cut], order[cut:]
    fits = {}
    for quad in ("sequence", "packed"):
        x = micro_batch_features([r["lengths"] for r in rows], quad)
        for stage in ("forward", "train"):
            y = np.array([r[f"{stage}_s"] for r in rows])
            model = CostModel.fit(x[train_idx], y[train_idx], relative=True, quadratic=quad)
            fits[(stage, quad)] = {"model": model, "held_out": prediction_error(model, x[test_idx], y[test_idx]),
                                   "train": prediction_error(model, x[train_idx], y[train_idx])}
    score = {q: np.mean([fits[(s, q)]["held_out"]["mean_rel_err"] for s in ("forward", "train")])
             for q in ("sequence", "packed")}
    chosen = min(score, key=score.get)
    return fits, chosen, {"train": len(train_idx), "held_out": len(test_idx)}


# ---------------------------------------------------------------- 2. real part


def _recording_worker():
    """IntegratedWorker that records each rank's micro-batch lengths."""
    from mindspeed_rl.workers.integrated_worker import IntegratedWorker

    class RecordingWorker(IntegratedWorker):
        def _micro_batches(self, lengths, fixed_size, sync):
            parts = super()._micro_batches(lengths, fixed_size, sync)
            log = self.__dict__.setdefault("_mb_log", [])
            log.extend([[int(lengths[i]) for i in p] for p in parts])
            return parts

        def pop_micro_batches(self):
            out, self._mb_log = self.__dict__.get("_mb_log", []), []
            return out

    return RecordingWorker


def _put_batch(td, batch):
    """Prompts, then responses / lengths / scores / advantages for every row (rollout skipped)."""
    import torch

    td.clear()
    td.put_prompts_experience({"prompts": batch["prompts"], "labels": batch["labels"]}, ["labels"])
    rows = len(batch["responses"])
    td.put_experience({
        "responses": batch["responses"],
        "response_length": [torch.tensor([r.numel()]) for r in batch["responses"]],
        "rm_scores": batch["rm_scores"],
        "advantages": batch["advantages"],
    }, list(range(rows)))


def _make_batch(seed):
    import torch

    prompt_len, resp_len = real_lengths(seed)
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed + 1)
    return {
        "prompts": [torch.randint(0, 32, (int(p),), generator=gen) for p in prompt_len],
        "labels": [torch.tensor([0]) for _ in prompt_len],
        "responses": [torch.randint(0, 32, (int(r),), generator=gen) for r in resp_len.reshape(-1)],
        "rm_scores": [torch.tensor([float(x)]) for x in rng.random(resp_len.size)],
        "advantages": [torch.tensor([float(x)]) for x in rng.standard_normal(resp_len.size)],
        "lengths": (prompt_len[:, None] + resp_len).reshape(-1).tolist(),
    }


def _run_round(group, docks, batch, balance):
    """One GRPO round without rollout; per stage the per-rank seconds, tokens and micro-batches.
    ``docks`` maps balance on/off to a driver dock built with that run plan."""
    td = docks[balance]
    _put_batch(td, batch)
    out = {"balance": balance, "stages": {}}
    names = {"ref_log_prob": "ref_log_prob", "actor_log_prob": "actor_log_prob", "update": "actor_train"}
    for stage in STAGES:
        key = names[stage]
        # dispatch, one call per rank, one put of the outputs (the log-prob stages' feed the update)
        results = run_dp_stage(group, td, StageGroup.of(td.run_plan.stages[key]), kl_coef=KL_COEF)
        mbs = group.execute_sync_command("pop_micro_batches")
        out["stages"][stage] = {
            "seconds": [float(r[f"timing/{key}"]) for r in results],
            "tokens": [float(r[f"tokens/{key}"]) for r in results],
            "micro_batches": mbs,
        }
    metrics = td.round_summary()["metrics"]  # also drains the balance history
    out["dock_imbalance"] = {s: metrics[f"dp_balance/{s}/imbalance"] for s in ("ref_log_prob", "actor_log_prob",
                                                                               "actor_train")
                             if f"dp_balance/{s}/imbalance" in metrics}
    out["step_s"] = float(sum(max(v["seconds"]) for v in out["stages"].values()))
    out["rank_s"] = [float(sum(v["seconds"][r] for v in out["stages"].values())) for r in range(DP)]
    return out


def run_real(model_dir, pairs, seed):
    """Warm-up, then ``pairs`` iterations each run with balance off and on
    (alternating which goes first) on the same batch."""
    from mindspeed_rl.plan.loader import build_configs, load_config
    from mindspeed_rl.models.tiny_model import EOS_ID, PAD_ID
    from mindspeed_rl.data.driver_dock import DriverDock
    from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

    overrides = [
        f"megatron_training.model_path={model_dir}",
        f"megatron_training.global_batch_size={PROMPTS}",
        "megatron_training.seq_length=2048",
        "generate_config.max_model_len=2048",
        f"rl_config.n_samples_per_prompt={N_REAL}",
        f"rl_config.mini_batch_size={PROMPTS // 2}",  # two optimizer steps: the old log-prob stage runs
        f"rl_config.max_prompt_length={REAL_PROMPT_RANGE[1]}",
        f"rl_config.max_packing_token_size={MAX_PACKING}",
        f"rl_config.init_kl_coef={KL_COEF}",  # > 0: the reference stage runs
        "rl_config.use_dp_batch_balance=true",
        "rl_config.td_timeout=120",
        f"rl_config.actor_resource.num_npus={DP}",
    ]
    cfgs = build_configs(load_config(str(CONFIG), overrides))
    plan_off = build_configs(load_config(str(CONFIG), overrides + ["rl_config.use_dp_batch_balance=false"])).plan
    actor = cfgs.actor_config
    started = init_ray(num_cpus=2, log_to_driver=False, logging_level=logging.WARNING)
    group = None
    try:
        t0 = time.perf_counter()
        group = RayActorGroup(_recording_worker(), cfgs.plan)
        group.initialize(actor.model_path, EOS_ID, PAD_ID)
        td = {b: DriverDock(PROMPTS, N_REAL, addition_columns=["labels"], run_plan=plan)
              for b, plan in ((True, cfgs.plan), (False, plan_off))}
        setup_s = time.perf_counter() - t0
        warm = _make_batch(seed + 999)
        for balance in (True, False):
            _run_round(group, td, warm, balance)
        iterations = []
        for i in range(pairs):
            batch = _make_batch(seed + i)
            order = (False, True) if i % 2 == 0 else (True, False)
            runs = {b: _run_round(group, td, batch, b) for b in order}
            iterations.append({"iteration": i + 1, "lengths": batch["lengths"],
                               "off": runs[False], "on": runs[True]})
        return {"setup_s": setup_s, "iterations": iterations,
                "config": {"dp": DP, "prompts": PROMPTS, "n": N_REAL, "max_packing_token_size": MAX_PACKING,
                           "response_cap": REAL_RESPONSE_CAP, "kl_coef": KL_COEF}}
    finally:
        if group is not None:
            group.shutdown()
        if started:
            shutdown_ray()


def analyse_real(real, fits, quad):
    """Model predictions of the real phase times, and a fit on half the iterations."""
    fwd, train = fits[("forward", quad)]["model"], fits[("train", quad)]["model"]
    its = real["iterations"]
    rows, pred_steps, meas_steps = [], [], []
    for it in its:
        for mode in ("off", "on"):
            run = it[mode]
            pred_step = 0.0
            for stage in STAGES:
                st = run["stages"][stage]
                model = train if stage == "update" else fwd
                feats = [rank_features(mbs, quad) for mbs in st["micro_batches"]]
                preds = [float(model.predict(f)[0]) for f in feats]
                st["features"] = [f.tolist() for f in feats]
                st["predicted_s"] = preds
                pred_step += max(preds)
                if stage in FORWARD_STAGES:
                    rows.extend({"iteration": it["iteration"], "features": f, "seconds": s}
                                for f, s in zip(feats, st["seconds"]))
            run["predicted_step_s"] = pred_step
            pred_steps.append(pred_step)
            meas_steps.append(run["step_s"])
    x = np.array([r["features"] for r in rows])
    y = np.array([r["seconds"] for r in rows])
    rel = np.abs(np.array(pred_steps) - np.array(meas_steps)) / np.array(meas_steps)
    out = {"calibrated_forward_on_real": prediction_error(fwd, x, y),
           "calibrated_step_on_real": {"mean_rel_err": float(rel.mean()), "max_rel_err": float(rel.max()),
                                       "n": int(rel.size)}}
    # fit on the first half of the iterations, predict the second half
    half = max(1, len(its) // 2)
    first = np.array([r["iteration"] <= half for r in rows])
    if first.sum() >= 3 and (~first).sum() >= 1:
        refit = CostModel.fit(x[first], y[first], relative=True, quadratic=quad)
        out["real_refit"] = {"model": refit, "fit_iterations": list(range(1, half + 1)),
                             "held_out": prediction_error(refit, x[~first], y[~first])}
    off = np.array([it["off"]["step_s"] for it in its])
    on = np.array([it["on"]["step_s"] for it in its])
    p_off = np.array([it["off"]["predicted_step_s"] for it in its])
    p_on = np.array([it["on"]["predicted_step_s"] for it in its])
    out["speedup"] = float(off.sum() / on.sum())
    out["speedup_per_iteration"] = (off / on).tolist()
    out["predicted_speedup"] = float(p_off.sum() / p_on.sum())
    out["mean_step_off_s"], out["mean_step_on_s"] = float(off.mean()), float(on.mean())
    return out


# ---------------------------------------------------------------- 3. simulation


def _sim_case(args):
    """One (n, k, seed) instance: step / ideal of every method for a GRPO step
    = ref forward + actor forward (free micro-batch counts) + update (synced)."""
    n, k, seed, fwd, train = args
    lens = sim_lengths(seed, GROUPS_PER_RANK * k, n)
    groups = lens.reshape(-1, n).sum(axis=1)
    # no equal-count split of whole groups can beat this token load
    out = {"n": n, "k": k, "seed": seed, "tok_lb_gap": sized_lower_bound(groups, k, True) / (groups.sum() / k) - 1}
    for m in METHODS:
        f = simulate_step_time(lens, k, m, n, fwd, max_token_len=SIM_MAX_TOKEN_LEN, seed=seed)
        t = simulate_step_time(lens, k, m, n, train, max_token_len=SIM_MAX_TOKEN_LEN, seed=seed,
                               sync_micro_batches=True)
        step, ideal = 2 * f["step"] + t["step"], 2 * f["ideal"] + t["ideal"]
        tokens = [sum(map(sum, r)) for r in f["micro_batch_lengths"]]
        out[m] = {"step": step, "ideal": ideal, "ratio": step / ideal,
                  "tok_imb": float(max(tokens) / np.mean(tokens) - 1)}
    return out


def run_simulation(fwd, train, ks, ns, seeds, workers):
    tasks = [(n, k, 1000 * k + 17 * n + s, fwd, train) for n in ns for k in ks for s in range(seeds)]
    # largest instances first, so both workers stay busy to the end
    tasks.sort(key=lambda t: -t[0] * t[1])
    if workers > 1:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            cases = list(pool.map(_sim_case, tasks))
    else:
        cases = [_sim_case(t) for t in tasks]
    rows = []
    for n in ns:
        for k in ks:
            cs = [c for c in cases if c["n"] == n and c["k"] == k]
            row = {"n": n, "k": k, "groups": GROUPS_PER_RANK * k, "samples": GROUPS_PER_RANK * k * n,
                   "seeds": len(cs)}
            for m in METHODS:
                row[m] = float(np.mean([c[m]["ratio"] for c in cs]))
            row["tok_lb_gap"] = float(np.mean([c["tok_lb_gap"] for c in cs]))
            row["ours_tok_imb"] = float(np.mean([c["ours"]["tok_imb"] for c in cs]))
            row["speedup_vs_off"] = float(np.mean([c["off"]["step"] / c["ours"]["step"] for c in cs]))
            row["speedup_vs_heap"] = float(np.mean([c["heap"]["step"] / c["ours"]["step"] for c in cs]))
            rows.append(row)
    return rows, cases


# ---------------------------------------------------------------- report


def _pair(values, fmt="{:.2f}"):
    return "/".join(fmt.format(v) for v in values)


def print_report(fits, chosen, split, real, real_an, sim_rows, targets, timings):
    print("=" * 100)
    print("DP batch balance, end to end: tiny Qwen2 (2 layers, width 64) on CPU, 1 thread per rank")
    print("=" * 100)
    cfg = real["config"]
    print(f"\n== 1. Real DP={cfg['dp']} GRPO phases (rollout skipped): {cfg['prompts']} prompts x n={cfg['n']}, "
          f"long-tail responses <= {cfg['response_cap']} tokens, "
          f"max_packing_token_size={cfg['max_packing_token_size']}")
    print("   seconds per rank r0/r1; step = sum over phases of the slowest rank; pred = cost model "
          "(calibrated in-process)")
    head = (f"{'iter':>4} {'mode':4} {'tokens r0/r1':>13} {'ref fwd':>11} {'actor fwd':>11} {'update':>11} "
            f"{'step':>6} {'pred':>6} {'imb':>6}")
    print(head)
    print("-" * len(head))
    for it in real["iterations"]:
        for mode in ("off", "on"):
            run = it[mode]
            st = run["stages"]
            tok = st["ref_log_prob"]["tokens"]
            imb = max(tok) / np.mean(tok) - 1
            print(f"{it['iteration']:>4} {mode:4} {_pair(tok, '{:.0f}'):>13} "
                  f"{_pair(st['ref_log_prob']['seconds']):>11} "
                  f"{_pair(st['actor_log_prob']['seconds']):>11} {_pair(st['update']['seconds']):>11} "
                  f"{run['step_s']:6.2f} {run['predicted_step_s']:6.2f} {100 * imb:5.1f}%")
    print(f"   mean step: off {real_an['mean_step_off_s']:.3f} s, on {real_an['mean_step_on_s']:.3f} s -> "
          f"measured speed-up {real_an['speedup']:.3f}x (per iteration "
          f"{', '.join(f'{s:.2f}' for s in real_an['speedup_per_iteration'])}); "
          f"model-predicted {real_an['predicted_speedup']:.3f}x")
    print("   (imb = token imbalance max/mean-1 of the ref stage; update times include waiting at the "
          "DDP all-reduce, so both ranks report about the slower one)")

    print(f"\n== 2. Cost model: seconds per micro-batch = a + b*tokens + c*Q, fitted (relative least squares, "
          f"non-negative) on {split['train']} micro-batches, scored on {split['held_out']} held-out ones")
    print("   Q = sum L^2 (sequence: varlen attention) or tokens^2 (packed: dense block-causal mask, "
          "what this engine runs on CPU)")
    head = (f"{'stage':8} {'Q':9} {'a (s)':>10} {'b (s/tok)':>10} {'c (s/tok^2)':>12} "
            f"{'r2':>7} {'mean|rel|':>9} {'max|rel|':>9} {'total':>7}")
    print(head)
    print("-" * len(head))
    for (stage, quad), f in fits.items():
        m, e = f["model"], f["held_out"]
        mark = " <- chosen" if quad == chosen else ""
        print(f"{stage:8} {quad:9} {m.a:10.2e} {m.b:10.2e} {m.c:12.2e} {e['r2']:7.4f} "
              f"{100 * e['mean_rel_err']:8.1f}% {100 * e['max_rel_err']:8.1f}% {100 * e['total_rel_err']:6.1f}%{mark}")
    e = real_an["calibrated_forward_on_real"]
    print(f"   calibrated '{chosen}' forward model on the real log-prob phases ({e['n']} rank-phases): "
          f"r2 {e['r2']:.3f}, mean |rel err| {100 * e['mean_rel_err']:.1f}%, max {100 * e['max_rel_err']:.1f}%")
    e = real_an["calibrated_step_on_real"]
    print(f"   calibrated model on the real step times ({e['n']} steps): mean |rel err| "
          f"{100 * e['mean_rel_err']:.1f}%, max {100 * e['max_rel_err']:.1f}%")
    if "real_refit" in real_an:
        rf = real_an["real_refit"]
        m, e = rf["model"], rf["held_out"]
        its = rf["fit_iterations"]
        print(f"   refit on real log-prob phases of iterations {its[0]}-{its[-1]}: a={m.a:.2e} b={m.b:.2e} "
              f"c={m.c:.2e}; on the other iterations ({e['n']} rank-phases): r2 {e['r2']:.3f}, "
              f"mean |rel err| {100 * e['mean_rel_err']:.1f}%, max {100 * e['max_rel_err']:.1f}%")

    print(f"\n== 3. Simulated at scale with the fitted '{chosen}' model: step = ref fwd + actor fwd + update "
          f"(update micro-batch counts synced over DP), {GROUPS_PER_RANK} groups per rank, responses lognormal "
          f"<= {SIM_RESPONSE_CAP}, micro-batches <= {SIM_MAX_TOKEN_LEN} tokens")
    print("   step / ideal (ideal = the split's total predicted work / k), mean over seeds; speed-up = "
          "step(off or heap) / step(ours);")
    print("   tokLB = token lower bound of any equal-count group split over mean - 1 (unreachable part); "
          "ours tok = ours' token imbalance")
    head = (f"{'n':>3} {'k':>4} {'groups':>6} {'samples':>7} {'seeds':>5} | {'off':>7} {'heap':>7} {'ours':>7} | "
            f"{'tokLB':>6} {'ours tok':>8} | {'ours vs off':>11} {'ours vs heap':>12}")
    print(head)
    print("-" * len(head))
    for r in sim_rows:
        print(f"{r['n']:>3} {r['k']:>4} {r['groups']:>6} {r['samples']:>7} {r['seeds']:>5} | {r['off']:7.3f} "
              f"{r['heap']:7.3f} {r['ours']:7.3f} | {100 * r['tok_lb_gap']:5.2f}% {100 * r['ours_tok_imb']:7.2f}% | "
              f"{r['speedup_vs_off']:10.2f}x {r['speedup_vs_heap']:11.3f}x")

    print("\nTARGETS")
    for t in targets:
        print(f"  [{'PASS' if t['ok'] else 'FAIL' if t['ok'] is not None else 'INFO'}] {t['name']}: {t['detail']}")
    print("\ntimings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))


def make_targets(sim_rows, sim_cases, real_an):
    worst = max(sim_rows, key=lambda r: r["ours"])
    slowest = min(sim_rows, key=lambda r: r["speedup_vs_off"])
    # instances whose groups allow an exactly even token split (lower bound at the mean)
    free = [c for c in sim_cases if c["tok_lb_gap"] <= 1e-9]
    within = sum(c["ours"]["ratio"] - 1 <= IDEAL_TARGET for c in free)
    worst_free = max((c["ours"]["ratio"] for c in free), default=float("nan"))
    return [
        {"name": f"simulated: ours within {100 * IDEAL_TARGET:.0f}% of the ideal at every k",
         "ok": None,  # reported: the whole-group equal-count token bound itself is above 3% at some k
         "detail": f"worst ours step/ideal {worst['ours']:.4f} (n={worst['n']}, k={worst['k']}; token lower "
                   f"bound there {100 * worst['tok_lb_gap']:.2f}% above the mean)"},
        {"name": f"simulated: ours >= {SPEEDUP_TARGET}x faster than unbalanced (off) at every k",
         "ok": bool(slowest["speedup_vs_off"] >= SPEEDUP_TARGET),
         "detail": f"smallest speed-up {slowest['speedup_vs_off']:.2f}x (n={slowest['n']}, k={slowest['k']})"},
        {"name": "simulated: instances whose token lower bound equals the mean (reported)", "ok": None,
         "detail": f"ours within {100 * IDEAL_TARGET:.0f}% of the ideal in {within}/{len(free)} of them, "
                   f"worst step/ideal {worst_free:.4f}"},
        {"name": "real DP=2 measured speed-up (reported, no target)", "ok": None,
         "detail": (lambda r: f"{real_an['speedup']:.3f}x over all pairs; per paired on/off iteration median "
                              f"{np.median(r):.3f}x, min-max {min(r):.3f}-{max(r):.3f}x over {len(r)} pairs; "
                              f"{real_an['predicted_speedup']:.3f}x predicted by the model")(
             real_an["speedup_per_iteration"])},
    ]


def _jsonable(obj):
    if isinstance(obj, CostModel):
        return {"a": obj.a, "b": obj.b, "c": obj.c, "quadratic": obj.quadratic}
    if isinstance(obj, dict):
        return {str(k) if not isinstance(k, tuple) else "/".join(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def save_png(path, sim_rows, real):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {"off": "tab:red", "heap": "tab:orange", "ours": "tab:green"}
    for n, style in zip(SIM_NS, ("-", "--")):
        rs = [r for r in sim_rows if r["n"] == n]
        if not rs:
            continue
        for m in METHODS:
            ax1.plot([r["k"] for r in rs], [r[m] for r in rs], style, marker="o", color=colors[m],
                     label=f"{m}, n={n}")
    ax1.axhline(1.0, color="gray", lw=0.8)
    ax1.axhline(1.0 + IDEAL_TARGET, color="gray", lw=0.8, ls=":", label=f"ideal +{100 * IDEAL_TARGET:.0f}%")
    ax1.set_xscale("log", base=2)
    ax1.set_xticks(sorted({r["k"] for r in sim_rows}), [str(k) for k in sorted({r["k"] for r in sim_rows})])
    ax1.set_xlabel("DP ranks k")
    ax1.set_ylabel("step time / ideal")
    ax1.set_title("Simulated (fitted cost model)")
    ax1.legend(fontsize=8)
    its = real["iterations"]
    x = np.arange(len(its))
    w = 0.2
    for j, (mode, rank) in enumerate([("off", 0), ("off", 1), ("on", 0), ("on", 1)]):
        vals = [it[mode]["rank_s"][rank] for it in its]
        ax2.bar(x + (j - 1.5) * w, vals, w, color="tab:red" if mode == "off" else "tab:green",
                alpha=0.5 if rank else 0.9, label=f"balance {mode}, rank {rank}")
    ax2.set_xticks(x, [str(it["iteration"]) for it in its])
    ax2.set_xlabel("iteration (same batch for off and on)")
    ax2.set_ylabel("seconds (ref + actor fwd + update)")
    ax2.set_title(f"Measured per-rank phase time, DP={DP} on CPU\n(update includes the wait at the DDP all-reduce)",
                  fontsize=10)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short run (< 1 min)")
    parser.add_argument("--json", default=None,
                        help=f"result file (default {DEFAULT_JSON.relative_to(ROOT)}; with --quick a temp folder)")
    parser.add_argument("--png", default=None,
                        help=f"figure (default {DEFAULT_PNG.relative_to(ROOT)}; with --quick a temp folder)")
    parser.add_argument("--seeds", type=int, default=None, help="simulation seeds per case")
    parser.add_argument("--pairs", type=int, default=None, help="real iterations (each off and on)")
    parser.add_argument("--workers", type=int, default=2, help="processes for the simulation")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    q = args.quick
    if q and (args.json is None or args.png is None):  # a smoke run never overwrites the committed results
        out = tempfile.mkdtemp(prefix="msrl_e2e_quick_")
        args.json = args.json or os.path.join(out, DEFAULT_JSON.name)
        args.png = args.png or os.path.join(out, DEFAULT_PNG.name)
    args.json, args.png = args.json or str(DEFAULT_JSON), args.png or str(DEFAULT_PNG)
    pairs = args.pairs or (2 if q else 6)
    seeds = args.seeds or (1 if q else 5)
    ks = (8, 32) if q else SIM_KS

    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    from mindspeed_rl.models.tiny_model import build_tiny_checkpoint

    timings = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="msrl_e2e_") as tmp:
        model_dir = build_tiny_checkpoint(os.path.join(tmp, "tiny"), seed=args.seed, max_position_embeddings=2048)
        t = time.perf_counter()
        calib = calibrate(model_dir, 24 if q else 60, 1 if q else 3, args.seed)
        fits, chosen, split = fit_calibration(calib, args.seed)
        timings["calibration"] = time.perf_counter() - t
        t = time.perf_counter()
        real = run_real(model_dir, pairs, args.seed)
        timings["real"] = time.perf_counter() - t
    real_an = analyse_real(real, fits, chosen)
    t = time.perf_counter()
    fwd, train = fits[("forward", chosen)]["model"], fits[("train", chosen)]["model"]
    sim_rows, sim_cases = run_simulation(fwd, train, ks, SIM_NS, seeds, args.workers)
    timings["simulation"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start
    targets = make_targets(sim_rows, sim_cases, real_an)
    print_report(fits, chosen, split, real, real_an, sim_rows, targets, timings)

    for path in (args.json, args.png):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    result = {"quick": q, "calibration": calib, "fits": fits, "chosen_quadratic": chosen, "split": split,
              "real": real, "real_analysis": real_an, "simulation": {"rows": sim_rows, "cases": sim_cases},
              "targets": targets, "timings_s": timings,
              "settings": {"sim_ks": list(ks), "sim_ns": list(SIM_NS), "groups_per_rank": GROUPS_PER_RANK,
                           "sim_response_cap": SIM_RESPONSE_CAP, "sim_max_token_len": SIM_MAX_TOKEN_LEN,
                           "seeds": seeds, "pairs": pairs}}
    Path(args.json).write_text(json.dumps(_jsonable(result), indent=1))
    save_png(args.png, sim_rows, real)
    print(f"wrote {args.json} and {args.png}")
    if any(t["ok"] is False for t in targets):
        print("some targets FAILED", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
