"""Rollout backends on CPU: transformers generate (HFRollout) vs an in-process vLLM engine (VLLMRollout).

1. Rollout tokens/s: the same model, prompts and sampling for both backends, one process per
   (model, backend, dtype) with one core (VLLMRollout binds its OpenMP threads to one core as rank 0
   of 2 ranks on a 2-core node; HF runs torch.set_num_threads(1), pinned to that same core). 32 prompts of 16-64 random
   tokens, 128 new tokens each (no EOS: every response runs to full length), temperature 1.
   Models: the tiny Qwen2 (2 layers, hidden 64, 2 heads of 32, vocab 32), a 14M one (2 layers,
   hidden 512, 8 heads, 2 kv heads, vocab 8192) and a ~150M Qwen2-shaped random model (8 layers,
   hidden 896, 14 heads, 2 kv heads, intermediate 4864, vocab 32000). bf16 runs on the tiny model,
   and at 150M only on a CPU with native bf16 (else ~6 min a call). Start-up (engine load, vLLM's
   profiling / warm-up) is timed apart; one small warm-up call runs before the timed calls.
2. GRPO iteration time through cli/train_grpo.py at ~150M with each backend (DP=2, fp32, 128-token
   responses): median timing/iteration and timing/actor_rollout/max over iterations after the first.
3. DP balance with vLLM: two rollout shares of a long-tail length mix, split at random vs balanced by
   prompt length (get_seqlen_balanced_partitions); each share timed through one VLLMRollout engine
   (continuous batching, max_num_seqs >= share size); the step's time is the slower share.

Prints markdown tables and a TARGETS block; exits 1 when a target printed as FAIL fails.
Judged: the 14M rollout (vLLM faster than HF), full-length responses, and in the full run the 150M
targets (rollout >= 3x tokens/s, GRPO iteration >= 2x). --target-scale multiplies the speed-up
targets (to see the FAIL path). --quick: tiny and 14M models only (rollout; DP balance on the tiny
one), no CLI runs, ~2 min; writes nothing under benchmarks/results/ (a temp folder instead). Full
runs (~20 min on 2 cores) write benchmarks/results/bench_rollout.{md,json}.

Usage:
    python benchmarks/bench_rollout.py [--quick] [--repeats N] [--out-dir DIR] [--target-scale X]
"""
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # before vllm is imported: engine in-process

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
CONFIG = ROOT / "configs" / "grpo_tiny_cpu.yaml"

PROMPTS = 32
PROMPT_RANGE = (16, 64)
NEW_TOKENS = 128
CORES = 1                      # per engine, as each of 2 DP ranks gets on a 2-core node
MODEL_SMALL = dict(num_hidden_layers=2, hidden_size=512, num_attention_heads=8, num_key_value_heads=2,
                   intermediate_size=2752, vocab_size=8192, max_position_embeddings=1024, tie_word_embeddings=True)
MODEL_150M = dict(num_hidden_layers=8, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864, vocab_size=32000, max_position_embeddings=1024,
                  tie_word_embeddings=True)
CLI_150M = ["megatron_training.num_layers=8", "megatron_training.hidden_size=896",
            "megatron_training.ffn_hidden_size=4864", "megatron_training.num_attention_heads=14",
            "megatron_training.num_query_groups=2", "megatron_training.vocab_size=32000",
            "megatron_training.padded_vocab_size=32000", "megatron_training.max_position_embeddings=1024"]

ROLLOUT_TARGET = 3.0           # vLLM / HF tokens/s, same dtype, 150M
ITERATION_TARGET = 2.0         # HF / vLLM GRPO iteration time, 150M
SMALL_TARGET = 1.0             # vLLM / HF tokens/s on the 14M model (fp32): judged in --quick too


# ---------------------------------------------------------------- models and prompts


def build_models(tmp: str, with_150m: bool) -> dict:
    from transformers import AutoModelForCausalLM, Qwen2Config
    import torch
    from mindspeed_rl.models.tiny_model import build_tiny_checkpoint
    models = {"tiny": build_tiny_checkpoint(os.path.join(tmp, "tiny"), seed=0, num_attention_heads=2,
                                            num_key_value_heads=2, max_position_embeddings=1024)}
    for name, shape in (("14M", MODEL_SMALL), ("150M", MODEL_150M)):
        if name == "150M" and not with_150m:
            continue
        path = os.path.join(tmp, name)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(Qwen2Config(**shape)).save_pretrained(path)
        models[name] = path
    return models


def param_count(path: str) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM
    import torch
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in model.parameters())


def random_prompts(vocab: int, count: int, lengths, seed: int):
    import torch
    g = torch.Generator().manual_seed(seed)
    if isinstance(lengths, tuple):
        lengths = torch.randint(lengths[0], lengths[1] + 1, (count,), generator=g).tolist()
    return [torch.randint(0, vocab, (int(n),), generator=g) for n in lengths]


# ---------------------------------------------------------------- child: one engine, timed


def _engine(model_path: str, dtype: str):
    import torch
    from mindspeed_rl.models.causal_lm import CausalLMEngine
    return CausalLMEngine(model_path, torch.device("cpu"), dtype=getattr(torch, dtype), trainable=False)


def _vllm(actor, model_path: str, dtype: str, max_num_seqs: int, max_model_len: int):
    import torch
    from mindspeed_rl.plan.rollout_spec import RolloutSpec
    from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout
    spec = RolloutSpec(backend="vllm", reason="benchmark", dtype=dtype, max_num_seqs=max_num_seqs,
                       max_model_len=max_model_len, max_num_batched_tokens=max(2048, max_model_len))
    # rank 0 of 2 ranks on the node: VLLMRollout binds one core when the node has 2
    return VLLMRollout(spec, actor, model_path, torch.device("cpu"), rank=0, world_size=2, seed=1234)


def _core() -> str:
    """The cores VLLMRollout binds as rank 0 of 2 on this node."""
    from mindspeed_rl.models.rollout.vllm_backend import cpu_bind
    return cpu_bind(0, 2, sorted(os.sched_getaffinity(0)))


def child_rollout(job: dict) -> dict:
    """Start-up, a warm-up call, then repeated timed generate calls of one backend; with ``balance``
    (vLLM only) the DP-balance shares are timed on the same engine afterwards."""
    import torch
    torch.set_num_threads(CORES)
    balance = job.get("balance")
    t = time.perf_counter()
    actor = _engine(job["model"], job["dtype"])
    if job["backend"] == "hf":
        from mindspeed_rl.models.rollout.hf_backend import HFRollout
        rollout = HFRollout(actor)
        os.sched_setaffinity(0, [int(c) for c in _core().split(",")])  # the core vLLM's threads get
    else:
        seqs, longest = PROMPTS, PROMPT_RANGE[1] + NEW_TOKENS
        if balance:
            seqs = max(seqs, (len(balance["prompt_lens"]) + 1) // 2)  # a share holds half the prompts
            longest = max(longest, max(balance["prompt_lens"]) + max(max(r) for r in balance["responses"].values()))
        rollout = _vllm(actor, job["model"], job["dtype"], seqs, longest + 8)
    startup = time.perf_counter() - t
    vocab = actor.module.config.vocab_size
    prompts = random_prompts(vocab, PROMPTS, PROMPT_RANGE, seed=7)
    sampling = SimpleNamespace(max_tokens=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)
    warm = SimpleNamespace(**{**vars(sampling), "max_tokens": 4})
    rollout.generate(prompts[:2], warm, [0, 1], None, 0)
    runs = []
    for r in range(job["repeats"]):
        seeds = [1000 * r + i for i in range(len(prompts))]
        t = time.perf_counter()
        out = rollout.generate(prompts, sampling, seeds, None, 0)  # eos None: every response runs to full length
        wall = time.perf_counter() - t
        lengths = [int(x.numel()) for x in out.responses]
        runs.append({"seconds": wall, "tokens": sum(lengths), "min_len": min(lengths),
                     "tokens_per_s": sum(lengths) / wall})
    result = {"startup_s": startup, "runs": runs, "torch_threads": torch.get_num_threads(),
              "vllm_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND") if job["backend"] == "vllm" else None,
              "hf_affinity": sorted(os.sched_getaffinity(0)) if job["backend"] == "hf" else None}
    if balance:
        result["balance"] = time_shares(rollout, vocab, balance)
    rollout.close()
    return result


def time_shares(rollout, vocab: int, case: dict) -> dict:
    """Seconds of each share of each split (per response scenario and repeat) through the engine;
    response lengths are fixed per prompt (max_tokens, EOS ignored)."""
    from vllm import SamplingParams
    prompts = random_prompts(vocab, len(case["prompt_lens"]), case["prompt_lens"], seed=11)
    out = {}
    for scenario, responses in case["responses"].items():
        for split, parts in case["splits"][scenario].items():
            reps = []
            for _ in range(case["repeats"]):
                times = []
                for share in parts:
                    params = [SamplingParams(max_tokens=int(responses[i]), temperature=1.0, seed=i, ignore_eos=True,
                                             detokenize=False) for i in share]
                    reqs = [{"prompt_token_ids": prompts[i].tolist()} for i in share]
                    t = time.perf_counter()
                    rollout.llm.generate(reqs, params, use_tqdm=False)
                    times.append(time.perf_counter() - t)
                reps.append(times)
            out[f"{scenario}/{split}"] = reps
    return out


def run_child(job: dict, timeout: float) -> dict:
    """Run one rollout job in a fresh interpreter (vLLM's thread binding and state stay there)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(job)]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false",
               VLLM_LOGGING_LEVEL="ERROR")
    env.pop("VLLM_CPU_OMP_THREADS_BIND", None)  # VLLMRollout picks the core, as in a worker
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"rollout job {job['backend']} {job['dtype']} {job['model']} failed "
                       f"(rc {proc.returncode}):\n{proc.stderr[-3000:]}")


# ---------------------------------------------------------------- DP balance cases


def balance_case(n: int, prompt_median: int, prompt_cap: int, response_median: int, response_cap: int,
                 repeats: int, seed: int = 0) -> dict:
    """Long-tail prompt and response lengths for 2 shares; response lengths either independent of the
    prompt's ('independent', the usual case: unknown before generation) or rising with it ('follow',
    so prompt length predicts the work). Splits per scenario: random halves (the draw of median
    prompt+response imbalance among 101), balanced by prompt length, and the oracle balanced by
    prompt + response (needs the lengths the rollout has yet to produce)."""
    import numpy as np
    from mindspeed_rl.balance.seqlen_balancing import get_seqlen_balanced_partitions
    rng = np.random.default_rng(seed)
    prompt = np.clip(np.rint(rng.lognormal(np.log(prompt_median), 0.9, n)), 16, prompt_cap).astype(int)
    indep = np.clip(np.rint(rng.lognormal(np.log(response_median), 0.9, n)), 8, response_cap).astype(int)
    follow = np.sort(indep)[np.argsort(np.argsort(prompt, kind="stable"), kind="stable")]
    responses = {"independent": indep.tolist(), "follow": follow.tolist()}
    by_prompt = get_seqlen_balanced_partitions(prompt.tolist(), 2, equal_size=True)
    splits = {}
    for name, resp in responses.items():
        work = prompt + np.array(resp)
        draws = [rng.permutation(n) for _ in range(101)]
        draws.sort(key=lambda d: abs(int(work[d[: n // 2]].sum()) - int(work[d[n // 2:]].sum())))
        mid = draws[len(draws) // 2]
        splits[name] = {"random": [sorted(mid[: n // 2].tolist()), sorted(mid[n // 2:].tolist())],
                        "by prompt": by_prompt,
                        "oracle": get_seqlen_balanced_partitions(work.tolist(), 2, equal_size=True)}
    return {"prompt_lens": prompt.tolist(), "responses": responses, "splits": splits, "repeats": repeats}


def analyse_balance(case: dict, timed: dict) -> list:
    rows = []
    for key, reps in timed.items():
        scenario, split = key.split("/")
        parts, resp = case["splits"][scenario][split], case["responses"][scenario]
        rows.append({"scenario": scenario, "split": split,
                     "share_tokens": [sum(case["prompt_lens"][i] + resp[i] for i in s) for s in parts],
                     "share_max_response": [max(resp[i] for i in s) for s in parts],
                     "share_s": [statistics.median(r[k] for r in reps) for k in range(len(parts))],
                     "step_s": [max(r) for r in reps]})
    for row in rows:
        base = next(r for r in rows if r["scenario"] == row["scenario"] and r["split"] == "random")
        row["vs_random"] = statistics.median(base["step_s"]) / statistics.median(row["step_s"])
    return rows


# ---------------------------------------------------------------- GRPO iterations through the CLI


def run_cli(backend: str, model_dir: str, out_dir: str, iters: int, batch: int, timeout: float) -> dict:
    cmd = [sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config", str(CONFIG), "--tiny-model-dir",
           model_dir, "--output-dir", out_dir, *CLI_150M, f"megatron_training.train_iters={iters}",
           f"megatron_training.global_batch_size={batch}", f"generate_config.rollout_backend={backend}",
           "generate_config.dtype=float32", "generate_config.max_num_seqs=16", "generate_config.max_model_len=256",
           f"generate_config.sampling_config.max_tokens={NEW_TOKENS}", "rl_config.max_packing_token_size=1024"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT),
                          env=dict(os.environ, VLLM_LOGGING_LEVEL="ERROR"))
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"train_grpo.py ({backend}) failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in Path(out_dir, "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing/iteration" in r]
    return {"wall_s": wall, "iterations": [r["timing/iteration"] for r in rows],
            "rollout_s": [r["timing/actor_rollout/max"] for r in rows],
            "response_len": [r["response_length/mean"] for r in rows], "command": cmd[1:],
            "stages_s": {k[len("timing/"):-len("/max")]: [r[k] for r in rows] for k in rows[0]
                         if k.startswith("timing/") and k.endswith("/max")}}


# ---------------------------------------------------------------- report


def cell(values, fmt="{:.2f}") -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(f in flags for f in ("avx512_bf16", "amx_bf16"))


def measure(args, tmp: str) -> dict:
    quick = args.quick
    res = {"quick": quick, "load_before": os.getloadavg(), "cpus": os.cpu_count()}
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    models = build_models(tmp, with_150m=not quick)
    res["params"] = {name: param_count(path) for name, path in models.items()}
    bf16_big = native_bf16()
    plan = [("tiny", "float32")] + ([] if quick else [("tiny", "bfloat16")]) + [("14M", "float32")]
    if not quick:
        plan += [("150M", "float32")] + ([("150M", "bfloat16")] if bf16_big else [])
    res["bf16_150m_skipped"] = None if bf16_big or quick else (
        "no native bf16 on this CPU (no avx512_bf16/amx): measured once, HF bf16 ran 11.7 tok/s and vLLM bf16 "
        "20.8 tok/s at 150M (~6 min a call), too slow to repeat here")
    cases = {"tiny": balance_case(32, 64, 512, 48, 256, repeats=1 if quick else 3)}
    if not quick:
        cases["150M"] = balance_case(16, 48, 256, 32, 128, repeats=1)
    res["balance_cases"] = cases
    res["rollout"] = []
    for name, dtype in plan:
        repeats = args.repeats or (2 if quick or name == "150M" else 3)
        for backend in ("hf", "vllm"):
            job = {"model": models[name], "backend": backend, "dtype": dtype, "repeats": repeats}
            if backend == "vllm" and dtype == "float32" and name in cases:
                job["balance"] = cases[name]
            t = time.perf_counter()
            print(f"... rollout {name} {dtype} {backend} x{repeats}", flush=True)
            out = run_child(job, timeout=3600)
            out.update(model=name, dtype=dtype, backend=backend, job_wall_s=time.perf_counter() - t)
            if "balance" in out:
                out["balance"] = analyse_balance(cases[name], out["balance"])
            res["rollout"].append(out)
    res["cli"] = {}
    if not quick:
        for backend in ("hf", "vllm"):
            print(f"... GRPO {backend} x{args.cli_iters} iterations", flush=True)
            res["cli"][backend] = run_cli(backend, os.path.join(tmp, "cli_model"), os.path.join(tmp, f"cli_{backend}"),
                                          args.cli_iters, args.cli_batch, timeout=3600)
    res["load_after"] = os.getloadavg()
    return res


def _find(res, model, dtype, backend):
    return next((r for r in res["rollout"] if (r["model"], r["dtype"], r["backend"]) == (model, dtype, backend)),
                None)


def _tps(row):
    return statistics.median(r["tokens_per_s"] for r in row["runs"])


def make_targets(res: dict, scale: float = 1.0) -> list:
    """(name, status, detail); status PASS / FAIL / INFO."""
    out = []
    full = NEW_TOKENS * PROMPTS
    short = [f"{r['model']} {r['dtype']} {r['backend']}" for r in res["rollout"]
             if any(x["tokens"] != full for x in r["runs"])]
    out.append(("full length", "FAIL" if short else "PASS",
                f"every timed call returned {PROMPTS} x {NEW_TOKENS} tokens" if not short else
                f"short responses in: {', '.join(short)} (tokens/s still counts the tokens returned)"))
    hf, vl = _find(res, "tiny", "float32", "hf"), _find(res, "tiny", "float32", "vllm")
    out.append(("tiny rollout", "INFO", f"fp32: vLLM {_tps(vl):.0f} vs HF {_tps(hf):.0f} tokens/s = "
                f"{_tps(vl) / _tps(hf):.2f}x; no target: per-step overheads (~3-4 ms either way) decide, and the "
                f"order flips with the machine's load"))
    hf, vl = _find(res, "14M", "float32", "hf"), _find(res, "14M", "float32", "vllm")
    ratio, want = _tps(vl) / _tps(hf), SMALL_TARGET * scale
    out.append(("14M rollout", "PASS" if ratio > want else "FAIL",
                f"fp32: vLLM {_tps(vl):.0f} vs HF {_tps(hf):.0f} tokens/s = {ratio:.2f}x; target > {want:g}x"))
    want = ROLLOUT_TARGET * scale
    for dtype in ("float32", "bfloat16"):
        hf, vl = _find(res, "150M", dtype, "hf"), _find(res, "150M", dtype, "vllm")
        if hf is None or vl is None:
            why = "not run in --quick (150M is the full run's)" if res["quick"] else res["bf16_150m_skipped"]
            out.append((f"150M rollout {dtype}", "INFO", f"target >= {want:g}x: {why}"))
            continue
        ratio = _tps(vl) / _tps(hf)
        out.append((f"150M rollout {dtype}", "PASS" if ratio >= want else "FAIL",
                    f"vLLM {_tps(vl):.1f} vs HF {_tps(hf):.1f} tokens/s = {ratio:.2f}x; target >= {want:g}x"))
    want = ITERATION_TARGET * scale
    if not res["cli"]:
        out.append(("150M GRPO iteration", "INFO", f"target >= {want:g}x: the CLI runs are skipped in --quick"))
    else:
        h, v = (statistics.median(res["cli"][b]["iterations"][1:]) for b in ("hf", "vllm"))
        hr, vr = (statistics.median(res["cli"][b]["rollout_s"][1:]) for b in ("hf", "vllm"))
        out.append(("150M GRPO iteration", "PASS" if h / v >= want else "FAIL",
                    f"HF {h:.1f} s vs vLLM {v:.1f} s per iteration = {h / v:.2f}x; target >= {want:g}x (the "
                    f"stages besides rollout took {h - hr:.1f} vs {v - vr:.1f} s: see section 2)"))
    return out


def report(res: dict, targets: list, args) -> str:
    lines = []
    add = lines.append
    rows = res["rollout"]
    add(f"# Rollout backends on CPU{' (--quick)' if res['quick'] else ''}")
    add("")
    add(f"Machine: {res['cpus']} cores; load average before {res['load_before'][0]:.1f}, after "
        f"{res['load_after'][0]:.1f} (other processes share these cores: spreads include them).")
    bind = next((r["vllm_bind"] for r in rows if r["vllm_bind"]), "?")
    hf_cores = next((r["hf_affinity"] for r in rows if r.get("hf_affinity")), "?")
    add(f"Cores per engine: {CORES} (vLLM: VLLMRollout as rank 0 of 2 on this node binds "
        f"VLLM_CPU_OMP_THREADS_BIND={bind}; HF: torch threads {rows[0]['torch_threads']}, process pinned to the same "
        f"core(s) {hf_cores}).")
    add("")
    add(f"## 1. Rollout tokens/s: {PROMPTS} prompts of {PROMPT_RANGE[0]}-{PROMPT_RANGE[1]} random tokens, "
        f"{NEW_TOKENS} new tokens each (no EOS), temperature 1")
    add("")
    add("Start-up: HF = loading the engine; vLLM = loading the engine + VLLMRollout (engine build, profiling, "
        "warm-up). Timed calls follow one 2-prompt warm-up call; median (min-max) over repeats.")
    add("")
    add("| model | params | dtype | backend | repeats | start-up s | generate s | tokens/s | vLLM / HF |")
    add("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        hf = _find(res, r["model"], r["dtype"], "hf")
        ratio = f"{_tps(r) / _tps(hf):.2f}x" if r["backend"] == "vllm" and hf else ""
        add(f"| {r['model']} | {res['params'][r['model']] / 1e6:.1f}M | {r['dtype']} | {r['backend']} | "
            f"{len(r['runs'])} | {r['startup_s']:.1f} | {cell([x['seconds'] for x in r['runs']])} | "
            f"{cell([x['tokens_per_s'] for x in r['runs']], '{:.1f}')} | {ratio} |")
    if res["bf16_150m_skipped"]:
        add("")
        add(f"150M bfloat16 not run: {res['bf16_150m_skipped']}.")
    add("")
    if res["cli"]:
        add(f"## 2. GRPO iteration, cli/train_grpo.py at 150M ({res['params'].get('150M', 0) / 1e6:.0f}M params)")
        add("")
        add(f"DP=2 (1 core per rank), fp32 (training and rollout), global_batch_size={args.cli_batch} x 4 samples, "
            f"{NEW_TOKENS}-token responses (max_tokens), max_packing_token_size=1024, vLLM max_num_seqs=16. "
            f"Medians (min-max) over iterations 2..{args.cli_iters} (the first includes warm-up).")
        add("")
        add("| backend | iteration s | actor_rollout/max s | first iteration s | mean response len | run wall s |")
        add("|---|---|---|---|---|---|")
        for b, c in res["cli"].items():
            add(f"| {b} | {cell(c['iterations'][1:])} | {cell(c['rollout_s'][1:])} | {c['iterations'][0]:.1f} | "
                f"{statistics.mean(c['response_len']):.1f} | {c['wall_s']:.0f} |")
        if all("stages_s" in c for c in res["cli"].values()):
            add("")
            add("Stage medians (slowest rank, iterations 2..): " + "; ".join(
                f"{b}: " + ", ".join(f"{k} {statistics.median(v[1:]):.1f} s" for k, v in c["stages_s"].items())
                for b, c in res["cli"].items()) + ".")
        h, v = (statistics.median(res["cli"][b]["iterations"][1:]) for b in ("hf", "vllm"))
        hr, vr = (statistics.median(res["cli"][b]["rollout_s"][1:]) for b in ("hf", "vllm"))
        rl = {b: statistics.mean(c["response_len"]) for b, c in res["cli"].items()}
        add("")
        add(f"HF / vLLM: iteration {h / v:.2f}x, rollout stage {hr / vr:.2f}x; the rollout stage is "
            f"{100 * hr / h:.0f}% of an HF iteration, so even a free rollout would give at most {h / (h - hr):.2f}x "
            f"with the rest unchanged. The rest (log-probs, update: the same code with either backend) took "
            f"{h - hr:.1f} s (HF run) vs {v - vr:.1f} s (vLLM run), mean response lengths {rl['hf']:.1f} vs "
            f"{rl['vllm']:.1f}: that gap is not the rollout's generate, and its cause is not established here (the "
            f"runs go one after the other on a shared machine; the vLLM worker also binds its rank's OpenMP "
            f"threads to one core). Read the iteration ratio with it.")
        add("")
    else:
        add("## 2. GRPO iteration: skipped in --quick (150M runs take minutes per iteration here)")
        add("")
    add("## 3. DP balance with vLLM (2 shares, one engine, max_num_seqs >= share size)")
    add("")
    add("Step time = the slower share's generate call. Response lengths are fixed per prompt (max_tokens, EOS "
        "ignored); 'independent': long-tail lengths unrelated to the prompt (as in RL: unknown before "
        "generation); 'follow': longer prompts get longer responses. Splits: random halves (what actor_rollout "
        "does now; the draw of median prompt+response imbalance among 101), balanced by prompt length "
        "(get_seqlen_balanced_partitions, equal_size), and the oracle balanced by prompt + response (lengths "
        "known only after generation). Random / this > 1: the split is faster than random.")
    add("")
    add("| model | responses | split | share tokens (p+r) | share longest response | share s | step s | "
        "random / this |")
    add("|---|---|---|---|---|---|---|---|")
    for r in rows:
        for b in r.get("balance", []):
            add(f"| {r['model']} | {b['scenario']} | {b['split']} | {' / '.join(map(str, b['share_tokens']))} | "
                f"{' / '.join(map(str, b['share_max_response']))} | "
                f"{' / '.join(f'{x:.2f}' for x in b['share_s'])} | {cell(b['step_s'])} | {b['vs_random']:.2f}x |")
    for r in rows:
        shares = [(t, m, x) for b in r.get("balance", [])
                  for t, m, x in zip(b["share_tokens"], b["share_max_response"], b["share_s"])]
        if len(shares) > 2:
            import numpy as np
            t, m, x = (np.array(v, dtype=float) for v in zip(*shares))
            by = {b["scenario"] + " " + b["split"]: b["vs_random"] for b in r["balance"] if b["split"] != "random"}
            add("")
            add(f"{r['model']}: share seconds vs share tokens: correlation {np.corrcoef(t, x)[0, 1]:.2f}; vs the "
                f"share's longest response: {np.corrcoef(m, x)[0, 1]:.2f}. Random / balanced step time: "
                + ", ".join(f"{k} {v:.2f}x" for k, v in by.items()) + ".")
    add("")
    add("## Targets" + (" (--quick: the 150M targets print INFO; '14M rollout' and 'full length' are judged)"
                        if res["quick"] else ""))
    add("")
    add("| target | status | detail |")
    add("|---|---|---|")
    for name, status, detail in targets:
        add(f"| {name} | {status} | {detail} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny and 14M models, no CLI runs (~2 min)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per backend (default 3 tiny / "
                                                                  "2 at 150M; 2 with --quick)")
    parser.add_argument("--cli-iters", type=int, default=3, help="GRPO iterations per backend (full run)")
    parser.add_argument("--cli-batch", type=int, default=4, help="global_batch_size (prompts) of the CLI runs")
    parser.add_argument("--out-dir", default=None, help=f"where bench_rollout.md/.json go (default "
                                                        f"{RESULTS.relative_to(ROOT)}; --quick: a temp folder)")
    parser.add_argument("--target-scale", type=float, default=float(os.environ.get("MSRL_BENCH_TARGET_SCALE", 1)),
                        help="multiply every speed-up target (e.g. 100 to see the FAIL path)")
    args = parser.parse_args(argv)
    if args.cli_iters < 2:
        parser.error("--cli-iters must be >= 2 (the first iteration is warm-up)")
    out_dir = Path(args.out_dir or (tempfile.mkdtemp(prefix="msrl_rollout_quick_") if args.quick else RESULTS))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="msrl_bench_rollout_") as tmp:
        res = measure(args, tmp)
    res["wall_s"] = time.perf_counter() - start
    targets = make_targets(res, args.target_scale)
    res["targets"] = [{"name": n, "status": s, "detail": d} for n, s, d in targets]
    text = report(res, targets, args) + f"\n\nWall time: {res['wall_s']:.0f} s.\n"
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bench_rollout.md").write_text(text)
    (out_dir / "bench_rollout.json").write_text(json.dumps(res, indent=1))
    print(f"wrote {out_dir / 'bench_rollout.md'} and {out_dir / 'bench_rollout.json'}")
    failed = [n for n, s, _ in targets if s == "FAIL"]
    if failed:
        print(f"targets FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _child_main(job: str) -> int:
    import warnings
    warnings.simplefilter("ignore")
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    result = child_rollout(json.loads(job))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(_child_main(sys.argv[2]))
    sys.exit(main())
