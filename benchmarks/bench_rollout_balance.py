"""Rollout balance on CPU: one queue across the DP engines against the static split, vLLM, DP=2, pinned and shared.

Every measurement runs in two placements, reported side by side:
- pinned: every engine (and every trainer rank of the CLI runs) on a core of its own with one thread, as every rank
  has a device of its own on accelerators (workers/scheduler/pinning.py: pin_process, MSRL_PIN_CORES=1): an engine
  that finishes early leaves its core idle, as a device idles. This is what the queue saves on devices; judged.
- shared: every engine on every core with as many threads (OpenMP threads wait passively: 2 engines x 2 threads
  on 2 cores do not spin against each other): an engine that finishes early lends its core to the others, the
  slow engine's tail speeds up, and the static split loses less than it would on devices (the CLI runs: no
  pinning, MSRL_THREADS_PER_WORKER = the cores). Reported, not judged.

1. Rollout stage (measured), per placement: two vLLM engines (Ray actors, the workers' own code: VLLMRollout's
   queue loop, RaySource, RolloutQueue in its actor) on rounds of 16 prompts x 8 samples with long-tail
   response lengths: per row max_tokens drawn lognormal (median 48, sigma 0.9, 4..512) with a prompt effect
   (60 % of the log-variance shared by a prompt's samples, as RL responses to one prompt run alike), EOS
   ignored, max_num_seqs 8. Each round runs three ways on the same rows and seeds:
   - static: the seeded random split of today's planner, one generate per engine (rl_config.rollout_balance:
     static, upstream's guarantee_order);
   - queue, epoch 1: the queue without history (a probe of every group first, then the groups seen to run long);
   - queue, epoch 2: the same prompts again, with the previous epoch's group means as the prior.
   Per way: the engines' imbalance (slowest busy / mean - 1), the stage (slowest engine), the bound (max of the
   mean busy time and the longest row, from the queue's own measurement) and the rows that came out identical
   to the static split's (float32: every row samples with its own seed).
2. GRPO iteration (full run only), per placement: cli/train_grpo.py at ~150M, DP=2, vLLM, with and without
   rl_config.rollout_balance static, on a checkpoint whose EOS logit is scaled up so that responses end at
   different lengths by themselves; median iteration and rollout-stage seconds after the first iteration.
3. Simulation to 8-256 engines from the per-step cost fitted to section 1's pinned queue steps
   (balance/rollout_cost.py: the replay drives the same RolloutQueue): static vs queue (epoch 1, epoch 2) vs the
   bound, with and without a prompt effect.

Prints markdown tables and a TARGETS block; exits 1 when a judged target fails. Judged, pinned, on the 150M model
in a full run and the 14M one in --quick, for each queue way: its stage seconds summed over the rounds <= the
static split's (static / queue >= 1.00x), its median imbalance <= 5 %, its median stage within 10 % of the bound,
every row identical to the static split's; in a full run also that the 14M model (the one --quick measures) gains
in the same direction as the 150M one in each placement, so that --quick never reads the other way. Reported, not
judged: the shared runs and a 1.2x speed-up.

--quick: 14M only, the same 5 rounds as a full run's 14M rows, both placements, no CLI runs, small simulation
(~5 min on 2 cores); writes nothing under benchmarks/results/ (a temporary folder unless --out-dir). A full run
(~45 min on 2 cores) writes benchmarks/results/bench_rollout_balance.{md,json} and its plot.

Usage:
    python benchmarks/bench_rollout_balance.py [--quick] [--placements pinned,shared] [--repeats N]
        [--out-dir DIR] [--target-scale X]
"""
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_rollout import CLI_150M, MODEL_150M, MODEL_SMALL, build_models  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CONFIG = ROOT / "configs" / "grpo_tiny_cpu.yaml"
PROMPTS, SAMPLES, CAP, ENGINES = 16, 8, 8, 2
MEDIAN, SIGMA, SHARED, MIN_TOKENS, MAX_TOKENS = 48, 0.9, 0.6, 4, 512
TARGETS = {"imbalance": 0.05, "gain": 1.0, "gap": 0.10, "speedup": 1.2}  # speedup: reported, not judged
WAYS = ("static", "queue", "queue_prior")
PLACEMENTS = ("pinned", "shared")
QUICK_MODEL, FULL_MODEL = "14M", "150M"


# ---------------------------------------------------------------- workload


def draw_round(rng, vocab: int):
    """(prompts, per-row response lengths, per-row prior of a previous epoch) of one round."""
    prompt_lens = rng.integers(16, 65, PROMPTS)
    prompts = [rng.integers(0, vocab, n).tolist() for n in prompt_lens]
    effect = rng.normal(0.0, SIGMA * np.sqrt(SHARED), PROMPTS)

    def sample():
        z = np.repeat(effect, SAMPLES) + rng.normal(0.0, SIGMA * np.sqrt(1 - SHARED), PROMPTS * SAMPLES)
        return np.clip(np.round(MEDIAN * np.exp(z)), MIN_TOKENS, MAX_TOKENS).astype(int)
    lengths = sample()
    prior = np.repeat(sample().reshape(PROMPTS, SAMPLES).mean(axis=1), SAMPLES)  # the last epoch's group means
    return [p for p in prompts for _ in range(SAMPLES)], lengths, prior


# ---------------------------------------------------------------- engines (Ray actors)


def engine_class():
    import ray

    @ray.remote(num_cpus=1)
    class Engine:
        """One rollout engine on ``cores`` with as many threads (pinned: one core; shared: every core):
        VLLMRollout with a per-row max_tokens (by seed)."""

        def __init__(self, cores, model: str):
            os.environ["OMP_NUM_THREADS"] = str(len(cores))  # before torch loads OpenMP (Ray gives an actor 1)
            if len(cores) > 1:  # shared: more threads than cores while both run; a waiting thread yields its core
                os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cores)
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
            import torch
            from mindspeed_rl.plan.rollout_spec import RolloutSpec
            from mindspeed_rl.models.causal_lm import CausalLMEngine
            from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout
            from mindspeed_rl.workers.scheduler.pinning import pin_process
            pin_process(cores)  # as a worker rank's pin_cores, before the engine starts its threads
            table = self.table = {}

            class Sized(VLLMRollout):
                def _params(self, sampling, seed, eos_id, budget=None):
                    params = super()._params(sampling, seed, eos_id, budget)
                    params.max_tokens = table[int(seed)]
                    return params
            actor = CausalLMEngine(model, torch.device("cpu"), dtype=torch.float32, trainable=False)
            spec = RolloutSpec("vllm", "benchmark", dtype="float32", max_num_seqs=CAP, max_model_len=1024,
                               max_num_batched_tokens=2048)
            self.rollout = Sized(spec, actor, model, torch.device("cpu"), rank=int(cores[0]), world_size=ENGINES,
                                 seed=0)
            from types import SimpleNamespace
            self.sampling = SimpleNamespace(max_tokens=MAX_TOKENS, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)

        def placement(self):
            """Where the engine runs, for the report: its cores and torch threads."""
            import torch
            return {"affinity": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}

        def lengths(self, table):
            self.table.clear()
            self.table.update({int(k): int(v) for k, v in table.items()})

        def static(self, prompts, seeds):
            import torch
            start = time.perf_counter()
            out = self.rollout.generate([torch.tensor(p) for p in prompts], self.sampling, seeds, None, None)
            return time.perf_counter() - start, [r.tolist() for r in out.responses]

        def serve(self, queue, key, consumer, order, prompts, seeds):
            import torch
            from mindspeed_rl.workers.rollout_source import RaySource
            source = RaySource(queue, key, consumer, order, {"prompts": [torch.tensor(p) for p in prompts]},
                               deadline=time.monotonic() + 1800)
            served = self.rollout.serve(source, self.sampling, lambda row: seeds[row], None, None, None)
            return {"busy": served.busy, "rows": served.rows, "latency": served.latency,
                    "responses": [r.tolist() for r in served.responses], "trace": served.trace_array().tolist()}

    return Engine


def run_round(engines, queue, key, prompts, lengths, prior, seed):
    """The three ways on one round; per way the busy seconds per engine, the responses and the traces."""
    import ray
    from mindspeed_rl.balance.balance_plan import BalancePlanner
    n = len(prompts)
    seeds = [int(seed) * 100000 + r for r in range(n)]
    ray.get([e.lengths.remote({s: lengths[r] for r, s in enumerate(seeds)}) for e in engines])
    out = {}
    split = BalancePlanner(seed=seed).random_split(n, ENGINES)
    timed = ray.get([e.static.remote([prompts[r] for r in share], [seeds[r] for r in share])
                     for e, share in zip(engines, split)])
    responses = {}
    for share, (_, made) in zip(split, timed):
        responses.update({int(r): m for r, m in zip(share, made)})
    out["static"] = {"busy": [t for t, _ in timed], "responses": responses}
    groups = (np.arange(n) // SAMPLES).tolist()
    for way, way_prior in (("queue", None), ("queue_prior", prior.tolist())):
        key += 1
        ray.get(queue.load.remote(key, n, ENGINES, None, None, groups, way_prior))
        served = ray.get([e.serve.remote(queue, key, c, list(range(n)), prompts, seeds)
                          for c, e in enumerate(engines)])
        out[way] = {"busy": [s["busy"] for s in served],
                    "responses": {r: m for s in served for r, m in zip(s["rows"], s["responses"])},
                    "latency": [x for s in served for x in s["latency"]],
                    "rows": [len(s["rows"]) for s in served],
                    "trace": [t for s in served for t in s["trace"]]}
    return out, key


def measure_rollout(model: str, vocab: int, repeats: int, cores, seed0: int = 0) -> dict:
    """The rounds of one model, engine e on ``cores[e]``; round k is the same draw in every placement and mode."""
    import ray
    from mindspeed_rl.balance.rollout_cost import balance_bound
    from mindspeed_rl.balance.rollout_queue import RolloutQueue
    Engine = engine_class()
    start = time.perf_counter()
    engines = [Engine.remote(mine, model) for mine in cores]
    queue = ray.remote(num_cpus=0)(RolloutQueue).remote()
    ray.get([e.lengths.remote({}) for e in engines])
    startup = time.perf_counter() - start
    placed = ray.get([e.placement.remote() for e in engines])
    # warm-up round (not timed): the engines' first steps compile and allocate
    rng = np.random.default_rng(10_000 + seed0)
    prompts, lengths, prior = draw_round(rng, vocab)
    _, key = run_round(engines, queue, 0, prompts[:16], np.minimum(lengths[:16], 8), prior[:16], 999)
    rounds = []
    for rep in range(repeats):
        rng = np.random.default_rng(seed0 + rep)
        prompts, lengths, prior = draw_round(rng, vocab)
        got, key = run_round(engines, queue, key, prompts, lengths, prior, seed0 + rep + 1)
        bound = balance_bound(got["queue"]["busy"], got["queue"]["latency"])
        ref = got["static"]["responses"]
        row = {"lengths": lengths.tolist(), "bound": bound}
        for way in WAYS:
            busy = np.asarray(got[way]["busy"])
            same = sum(got[way]["responses"][r] == ref[r] for r in ref)
            row[way] = {"busy": busy.tolist(), "stage": float(busy.max()),
                        "imbalance": float(busy.max() / busy.mean() - 1), "identical": same / len(ref),
                        "rows": got[way].get("rows"), "trace": got[way].get("trace")}
            row[way]["gap"] = row[way]["stage"] / bound - 1
        rounds.append(row)
    for e in engines:
        ray.kill(e)
    ray.kill(queue)
    return {"startup_s": startup, "rounds": rounds, "engines": placed}


# ---------------------------------------------------------------- GRPO through the CLI


def eos_checkpoint(path: str, scale: float) -> str:
    """The ~150M random model with its (tied) EOS embedding scaled: responses end by themselves."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config
    from mindspeed_rl.models.tiny_model import EOS_ID, build_toy_tokenizer
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**MODEL_150M))
    with torch.no_grad():
        model.get_input_embeddings().weight[EOS_ID] *= scale
    model.save_pretrained(path)
    build_toy_tokenizer().save_pretrained(path)  # the toy task's tokens (the CLI's data)
    return path


def cli_env(placement: str, base=None) -> dict:
    """The CLI's environment: pinned, every worker rank on a core of its own (MSRL_PIN_CORES=1, one thread);
    shared, no pinning and every rank with as many threads as this process may use cores (waiting passively)."""
    env = dict(os.environ if base is None else base, VLLM_LOGGING_LEVEL="ERROR")
    env.pop("MSRL_PIN_CORES", None)
    env.pop("MSRL_THREADS_PER_WORKER", None)
    if placement == "pinned":
        env["MSRL_PIN_CORES"] = "1"
    elif placement == "shared":
        env["MSRL_THREADS_PER_WORKER"] = str(len(os.sched_getaffinity(0)))
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # more threads than cores: a waiting thread yields its core
    else:
        raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
    return env


def run_cli(model_dir: str, out_dir: str, iters: int, static: bool, timeout: float, placement: str) -> dict:
    cmd = [sys.executable, str(ROOT / "cli" / "train_grpo.py"), "--config", str(CONFIG), "--tiny-model-dir",
           model_dir, "--output-dir", out_dir, *CLI_150M, f"megatron_training.train_iters={iters}",
           "megatron_training.global_batch_size=8", "rl_config.n_samples_per_prompt=8", "rl_config.mini_batch_size=64",
           "generate_config.rollout_backend=vllm", "generate_config.dtype=float32", f"generate_config.max_num_seqs={CAP}",
           "generate_config.max_model_len=320", "generate_config.sampling_config.max_tokens=256",
           "rl_config.max_packing_token_size=2048", f"rl_config.rollout_balance={'static' if static else 'queue'}",
           # a policy that stays put: the toy reward would teach this model to stop at once within two steps,
           # and the round's long tail (what is measured) would be gone
           "actor_config.lr=1.0e-9", "actor_config.min_lr=0.0"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(ROOT), env=cli_env(placement))
    if proc.returncode != 0:
        raise RuntimeError(f"train_grpo.py ({placement}) failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in Path(out_dir, "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing/iteration" in r][1:]  # after the first (warm-up) iteration
    return {"wall_s": time.perf_counter() - start, "iteration": [r["timing/iteration"] for r in rows],
            "rollout": [r["timing/actor_rollout/max"] for r in rows],
            "imbalance": [r.get("dp_balance/actor_rollout/rank_imbalance") for r in rows],
            "response_len": [r["response_length/mean"] for r in rows],
            "response_len_max": [r.get("response_length/max") for r in rows]}


# ---------------------------------------------------------------- simulation


def simulate(cost, engines_list, draws: int, rows_per_engine: int) -> list:
    from mindspeed_rl.balance.rollout_cost import simulate_queue, simulate_static
    out = []
    for shared in (SHARED, 0.0):
        for k in engines_list:
            rows = k * rows_per_engine
            res = {w: [] for w in ("static", "queue", "queue_prior", "bound")}
            for d in range(draws):
                rng = np.random.default_rng(1000 * k + d)
                prompts_n = rows // SAMPLES
                p = np.repeat(rng.integers(16, 65, prompts_n), SAMPLES)
                effect = np.repeat(rng.normal(0, SIGMA * np.sqrt(shared), prompts_n), SAMPLES)
                draw = lambda: np.clip(np.round(MEDIAN * np.exp(effect + rng.normal(  # noqa: E731
                    0, SIGMA * np.sqrt(1 - shared), rows))), MIN_TOKENS, MAX_TOKENS).astype(int)
                r, prior = draw(), draw().reshape(-1, SAMPLES).mean(axis=1).repeat(SAMPLES)
                groups = np.arange(rows) // SAMPLES
                split = np.array_split(rng.permutation(rows), k)
                static = simulate_static(p, r, [[s.tolist()] for s in split], cost, cap=CAP)
                queued = simulate_queue(p, r, range(rows), k, cost, cap=CAP, groups=groups)
                told = simulate_queue(p, r, range(rows), k, cost, cap=CAP, groups=groups, prior=prior)
                res["static"].append(static.stage)
                res["queue"].append(queued.stage)
                res["queue_prior"].append(told.stage)
                res["bound"].append(told.bound)
            out.append({"engines": k, "shared": shared, **{w: float(np.median(v)) for w, v in res.items()}})
    return out


# ---------------------------------------------------------------- report


def cell(values, fmt="{:.2f}") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def total_gain(rounds: list, way: str) -> float:
    """The static split's stage seconds over this way's, each summed over the rounds (> 1: the way is faster)."""
    return sum(r["static"]["stage"] for r in rounds) / sum(r[way]["stage"] for r in rounds)


def placed(res: dict):
    """(placement, model, its measurement) in report order."""
    for placement in PLACEMENTS:
        for model, m in res["rollout"].get(placement, {}).items():
            yield placement, model, m


def rollout_table(res: dict) -> str:
    lines = ["| model | placement | way | imbalance | stage s | bound s | stage / bound - 1 | static / this | "
             "rows identical to static | rows per engine |", "|---|---|---|---|---|---|---|---|---|---|"]
    for placement, model, m in placed(res):
        rounds = m["rounds"]
        for way in WAYS:
            gain = [r["static"]["stage"] / r[way]["stage"] for r in rounds]
            rows = [r[way]["rows"] for r in rounds if r[way]["rows"]]
            lines.append(f"| {model} | {placement} | {way} | {cell([r[way]['imbalance'] for r in rounds], '{:.1%}')} | "
                         f"{cell([r[way]['stage'] for r in rounds])} | {cell([r['bound'] for r in rounds])} | "
                         f"{cell([r[way]['gap'] for r in rounds], '{:.1%}')} | {cell(gain, '{:.2f}x')} | "
                         f"{cell([r[way]['identical'] for r in rounds], '{:.1%}')} | "
                         f"{'; '.join('/'.join(map(str, x)) for x in rows) or '-'} |")
    return "\n".join(lines)


def side_by_side(res: dict) -> str:
    """Per model and queue way, pinned next to shared: the stage ratio over all rounds, the median imbalance
    (static -> this way) and the median distance to the bound."""
    head = ["| model | way |"] + [f" {p}: static / this (sum of stages) | {p}: imbalance static -> this | "
                                 f"{p}: stage / bound - 1 |" for p in PLACEMENTS if p in res["rollout"]]
    lines = ["".join(head), "|---|---|" + "---|---|---|" * sum(p in res["rollout"] for p in PLACEMENTS)]
    models = list(dict.fromkeys(model for _, model, _ in placed(res)))
    for model in models:
        for way in WAYS[1:]:
            cells = [f"| {model} | {way} |"]
            for p in PLACEMENTS:
                if p not in res["rollout"]:
                    continue
                m = res["rollout"][p].get(model)
                if m is None:
                    cells.append(" - | - | - |")
                    continue
                rounds = m["rounds"]
                med = lambda w, k: statistics.median(r[w][k] for r in rounds)  # noqa: E731
                cells.append(f" {total_gain(rounds, way):.2f}x | {med('static', 'imbalance'):.1%} -> "
                             f"{med(way, 'imbalance'):.1%} | {med(way, 'gap'):.1%} |")
            lines.append("".join(cells))
    return "\n".join(lines)


def sim_table(sim: list) -> str:
    lines = ["| engines | prompt effect | static s | queue s (epoch 1) | queue s (epoch 2) | bound s | static / queue "
             "(1; 2) | queue / bound - 1 (1; 2) |", "|---|---|---|---|---|---|---|---|"]
    for s in sim:
        lines.append(f"| {s['engines']} | {s['shared']:.0%} | {s['static']:.2f} | {s['queue']:.2f} | "
                     f"{s['queue_prior']:.2f} | {s['bound']:.2f} | {s['static'] / s['queue']:.2f}x; "
                     f"{s['static'] / s['queue_prior']:.2f}x | {s['queue'] / s['bound'] - 1:.1%}; "
                     f"{s['queue_prior'] / s['bound'] - 1:.1%} |")
    return "\n".join(lines)


def make_targets(res: dict, scale: float) -> list:
    """(name, met, judged, detail) per target; a judged one that is not met fails the run."""
    model = res["judged"]
    out = []
    pinned = res["rollout"].get("pinned", {}).get(model)
    if pinned is None:
        out.append(("pinned run", False, True, "the judged targets need the pinned placement (--placements)"))
    else:
        rounds = pinned["rounds"]
        med = lambda way, key: statistics.median(r[way][key] for r in rounds)  # noqa: E731
        for way in WAYS[1:]:
            imb, gap, gain = med(way, "imbalance"), med(way, "gap"), total_gain(rounds, way)
            static_s, way_s = sum(r["static"]["stage"] for r in rounds), sum(r[way]["stage"] for r in rounds)
            out.append((f"stage {way}", gain >= TARGETS["gain"] * scale, True,
                        f"pinned {model}: static / {way} = {gain:.2f}x ({static_s:.2f} s / {way_s:.2f} s over "
                        f"{len(rounds)} rounds); target >= {TARGETS['gain'] * scale:.2f}x"))
            out.append((f"imbalance {way}", imb <= TARGETS["imbalance"] / scale, True,
                        f"pinned {model}: {imb:.1%}; target <= {TARGETS['imbalance'] / scale:.0%} "
                        f"(static {med('static', 'imbalance'):.1%})"))
            out.append((f"bound {way}", gap <= TARGETS["gap"] / scale, True,
                        f"pinned {model}: stage {gap:.1%} over the bound; target <= {TARGETS['gap'] / scale:.0%}"))
            same = min(r[way]["identical"] for r in rounds)
            out.append((f"rows {way}", same == 1.0, True,
                        f"pinned {model}: {same:.1%} of rows identical to the static split's"))
        best = max(total_gain(rounds, w) for w in WAYS[1:])
        out.append(("speed-up", best >= TARGETS["speedup"], False,
                    f"pinned {model}: best static / queue = {best:.2f}x; {TARGETS['speedup']:.1f}x reported, "
                    f"not judged"))
    shared = res["rollout"].get("shared", {}).get(model)
    if shared is not None:
        gains = ", ".join(f"{w} {total_gain(shared['rounds'], w):.2f}x" for w in WAYS[1:])
        out.append(("shared stage", all(total_gain(shared["rounds"], w) >= 1.0 for w in WAYS[1:]), False,
                    f"shared {model}: static / this = {gains} (engines lend cores; reported, not judged)"))
    if not res["quick"]:  # --quick measures the 14M model: it must read the same way as the judged one
        for placement in PLACEMENTS:
            got = res["rollout"].get(placement, {})
            if QUICK_MODEL in got and FULL_MODEL in got:
                for way in WAYS[1:]:
                    quick, full = (total_gain(got[m]["rounds"], way) for m in (QUICK_MODEL, FULL_MODEL))
                    out.append((f"quick agrees, {placement} {way}", (quick > 1.0) == (full > 1.0), True,
                                f"static / {way}: {QUICK_MODEL} {quick:.2f}x, {FULL_MODEL} {full:.2f}x; the same "
                                f"side of 1.00x"))
    if "cli_error" in res:
        out.append(("grpo iteration", False, True,
                    "the CLI runs failed: " + " ".join(res["cli_error"].split())[-300:]))
    return out


def status(met: bool, judged: bool) -> str:
    return ("PASS" if met else "FAIL") if judged else ("info: met" if met else "info: missed")


def report(res: dict, targets: list) -> str:
    engines = "; ".join(f"{p} {model}: " + ", ".join(f"engine {e} cores {x['affinity']} threads {x['threads']}"
                                                      for e, x in enumerate(m["engines"]))
                        for p, model, m in placed(res))
    parts = ["# Rollout balance on CPU: one queue across the DP engines vs the static split, pinned and shared", "",
             f"Machine: {res['cpus']} cores; load average before {res['load_before'][0]:.1f}, after "
             f"{res['load_after'][0]:.1f}. {ENGINES} vLLM engines (float32), max_num_seqs {CAP}; pinned: a core and "
             f"a thread per engine (an idle engine's core stays idle, as a device); shared: every core and as many "
             f"threads per engine (an idle engine lends its core). As run: {engines}. Rounds of {PROMPTS} prompts x "
             f"{SAMPLES} samples (prompts 16-64 tokens); response lengths lognormal (median {MEDIAN}, sigma {SIGMA}, "
             f"{MIN_TOKENS}..{MAX_TOKENS}), {SHARED:.0%} of the log-variance shared by a prompt's samples. Medians "
             f"(min-max) over rounds; the placements ran one after the other on the same rounds.", "",
             "## 1. Rollout stage (measured)", "", rollout_table(res), "",
             "### Pinned and shared side by side", "",
             "static / this: the static split's stage seconds summed over the rounds over this way's (> 1: the queue "
             "is faster); imbalance and stage / bound - 1: medians over rounds.", "", side_by_side(res), ""]
    for p, model, m in placed(res):
        parts.append(f"{model}, {p}: engine start-up {m['startup_s']:.0f} s; step cost fitted to the queue's steps: "
                     f"{m['cost']}.")
    if res.get("cli"):
        parts += ["", "## 2. GRPO iteration through the CLI (~150M, DP=2, vLLM, EOS-scaled checkpoint)", "",
                  "pinned: MSRL_PIN_CORES=1 (a core per worker rank); shared: no pinning, MSRL_THREADS_PER_WORKER "
                  "= the cores.", "",
                  "| placement | rollout | iteration s | rollout stage s | rollout imbalance | mean / max response "
                  "length |", "|---|---|---|---|---|---|"]
        for placement, ways in res["cli"].items():
            for way, c in ways.items():
                parts.append(f"| {placement} | {way} | {cell(c['iteration'])} | {cell(c['rollout'])} | "
                             f"{cell(c['imbalance'], '{:.1%}')} | {cell(c['response_len'], '{:.0f}')} / "
                             f"{cell(c['response_len_max'], '{:.0f}')} |")
    parts += ["", f"## 3. Simulation from the measured step cost ({res['sim_model']}, pinned: {res['sim_cost']}), "
              f"{res['sim_rows']} rows per engine", "", sim_table(res["sim"]), "", "## Targets", "",
              "| target | status | detail |", "|---|---|---|"]
    parts += [f"| {name} | {status(met, judged)} | {detail} |" for name, met, judged, detail in targets]
    parts += ["", f"Command: `{res['command']}`. Wall time: {res['wall_s']:.0f} s."]
    return "\n".join(parts) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    model = res["judged"]
    bars = [(p, way) for p in PLACEMENTS if model in res["rollout"].get(p, {}) for way in WAYS]
    width = 0.8 / max(1, len(bars))
    for i, (p, way) in enumerate(bars):
        busy = res["rollout"][p][model]["rounds"][0][way]["busy"]
        left.bar(np.arange(len(busy)) + (i - (len(bars) - 1) / 2) * width, busy, width, label=f"{p} {way}",
                 hatch="//" if p == "shared" else None, color=f"C{WAYS.index(way)}")
    for p, style in (("pinned", "--"), ("shared", ":")):
        if model in res["rollout"].get(p, {}):
            left.axhline(res["rollout"][p][model]["rounds"][0]["bound"], color="k", ls=style, lw=1, label=f"{p} bound")
    left.set_xticks(range(ENGINES), [f"engine {e}" for e in range(ENGINES)])
    left.set_ylabel("busy s")
    left.set_title(f"{model}: one round, busy time per engine (hatched: shared cores)")
    left.legend(fontsize=7)
    for shared, style in ((SHARED, "-"), (0.0, ":")):
        sim = [s for s in res["sim"] if s["shared"] == shared]
        ks = [s["engines"] for s in sim]
        for way, color in (("static", "C0"), ("queue", "C1"), ("queue_prior", "C2")):
            right.plot(ks, [s[way] / s["bound"] for s in sim], style, color=color, marker="o",
                       label=f"{way}, prompt effect {shared:.0%}")
    right.set_xscale("log", base=2)
    right.set_xlabel("engines")
    right.set_ylabel("stage / bound")
    right.set_title("simulated from the measured (pinned) step cost")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--placements", default=",".join(PLACEMENTS), help="pinned, shared or both (default)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--target-scale", type=float, default=1.0)
    args = parser.parse_args()
    placements = [p for p in args.placements.split(",") if p]
    if not placements or any(p not in PLACEMENTS for p in placements):
        parser.error(f"--placements takes {', '.join(PLACEMENTS)}, got {args.placements!r}")
    from mindspeed_rl.workers.scheduler.pinning import placement_cores
    cores = sorted(os.sched_getaffinity(0))
    try:
        engine_cores = {p: placement_cores(p, ENGINES, cores) for p in placements}
    except ValueError as err:
        parser.error(str(err))
    out_dir = Path(args.out_dir) if args.out_dir else (Path(tempfile.mkdtemp(prefix="bench_rb_")) if args.quick
                                                      else RESULTS)
    if args.quick and out_dir.resolve() == RESULTS.resolve():
        parser.error("--quick writes elsewhere: benchmarks/results/ holds a full run's numbers")
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    res = {"quick": args.quick, "load_before": os.getloadavg(), "cpus": len(cores), "rollout": {},
           "command": "python benchmarks/bench_rollout_balance.py " + " ".join(sys.argv[1:])}
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray
    from mindspeed_rl.balance.rollout_cost import fit_step_cost
    res["judged"] = QUICK_MODEL if args.quick else FULL_MODEL
    fits = {}
    with tempfile.TemporaryDirectory(prefix="rb_") as tmp:
        shapes = {QUICK_MODEL: MODEL_SMALL, FULL_MODEL: MODEL_150M}
        models = {name: (path, shapes[name]["vocab_size"])
                  for name, path in build_models(tmp, with_150m=not args.quick).items() if name in shapes}
        init_ray(num_cpus=ENGINES + 1)
        try:
            for name, (path, vocab) in models.items():
                for placement in placements:
                    got = res["rollout"].setdefault(placement, {})[name] = measure_rollout(
                        path, vocab, args.repeats, engine_cores[placement])
                    traces = [t for r in got["rounds"] for w in WAYS[1:] for t in r[w]["trace"]]
                    cost = fits[placement, name] = fit_step_cost(traces)
                    got["cost"] = (f"{cost.per_step * 1e3:.2f} ms + {cost.per_seq * 1e3:.3f} ms per sequence + "
                                   f"{cost.per_prefill_token * 1e3:.3f} ms per prompt token")
                    print(f"{name} {placement}: static / queue = {total_gain(got['rounds'], 'queue'):.2f}x, "
                          f"static / queue_prior = {total_gain(got['rounds'], 'queue_prior'):.2f}x", flush=True)
        finally:
            shutdown_ray()
        (out_dir / "bench_rollout_balance.partial.json").write_text(json.dumps(res, indent=1, default=str))
        if not args.quick:
            model = eos_checkpoint(os.path.join(tmp, "150M_eos"), scale=28.0)
            try:
                res["cli"] = {p: {way: run_cli(model, os.path.join(tmp, f"cli_{p}_{way}"), 4, way == "static", 3600, p)
                                  for way in ("static", "queue")} for p in placements}
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                res["cli_error"] = str(err)[-2000:]
    sim_placement = "pinned" if "pinned" in placements else placements[0]
    cost = fits[sim_placement, res["judged"]]
    res["sim_model"], res["sim_rows"] = res["judged"], 64
    res["sim_cost"] = res["rollout"][sim_placement][res["judged"]]["cost"]
    res["sim"] = simulate(cost, [2, 8, 32] if args.quick else [2, 8, 32, 64, 128, 256], 5 if args.quick else 15, 64)
    res["load_after"] = os.getloadavg()
    res["wall_s"] = time.perf_counter() - start
    targets = make_targets(res, args.target_scale)
    text = report(res, targets)
    print(text)
    for _, _, m in placed(res):
        for row in m["rounds"]:
            for way in WAYS:
                row[way].pop("trace", None)
    (out_dir / "bench_rollout_balance.md").write_text(text)
    (out_dir / "bench_rollout_balance.partial.json").unlink(missing_ok=True)
    (out_dir / "bench_rollout_balance.json").write_text(json.dumps(res, indent=1, default=str))
    plot(res, out_dir / "bench_rollout_balance.png")
    print(f"== TARGETS == (written to {out_dir})")
    for name, met, judged, detail in targets:
        print(f"{name:26s}: {status(met, judged)}  {detail}")
    failed = [name for name, met, judged, _ in targets if judged and not met]
    if failed:
        print(f"targets FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
