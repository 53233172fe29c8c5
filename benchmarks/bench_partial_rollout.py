"""Partial rollout against plain rollout on CPU: complete, train-ready rows per second of rollout, vLLM, DP=2.

Workload (bench_rollout_balance.py's, imported from it): iterations of ``global_batch_size`` prompts x 8 samples,
prompts 16-64 tokens, each row a natural response length L drawn lognormal (median 48, sigma 0.9, 4..512) with a
prompt effect (60 % of the log-variance shared by a prompt's samples); max_tokens 512. Two vLLM engines (one core
each, Ray actors) run the workers' own code: VLLMRollout.serve on the rollout queue (RaySource, RolloutQueue in
its actor), every row with its own new-token budget in the ``rollout_budget`` column (models/rollout/base.py).
The engines ignore EOS; a row's end is emulated: its budget is clamped to L minus the tokens it made, and a row
that reached L gets the EOS id (out of the vocabulary, never sampled) as its last token before
``CarryPool.extend``, which then marks it complete as a real EOS would.

Ways, each over ``--iters`` iterations after one warm-up iteration (not counted), on the same stream of prompt
batches (batch b of a repeat is the same draw for every way), taking turns an iteration each (the order rotating)
so that a load changing over time hits every way alike:
- plain: every iteration rolls batch i's rows out to their end (one queue round, budget L per row);
- partial N (partial_rollout_max_split = N): the trainer's loop (trainer/partial_rollout.py) around CarryPool:
  top the pool up while a whole batch fits (up to 2 x global_batch_size prompts), passes over the incomplete
  rows (at most ceil(max_tokens / N) new tokens each, carried rows first in the queue by CarryPool.pass_groups)
  until >= global_batch_size groups are complete, take them.
Metric (judged): rows trained / rollout seconds (wall time of the passes: queue load + both engines' serve) from an
empty pool to an empty pool: every iteration counts, the warm-up one too, and after the last one partial rollout
drains its pool (passes with no new prompts until every row is complete, every group trained) while plain rolls
out the batch the pool drew beyond the iterations: both ways finish the same prompts. Without the drain
the rows still in the pool at the end (the long ones: the pool trains complete groups first) are paid for only up
to where they were cut, and the warm-up iteration's work on rows trained later is free: a short run flatters
partial rollout (the "pool left" column: iterations after the warm-up, the pool left as it is, as before). Median
(min-max) over repeats; also, over the iterations after the warm-up, rollout seconds and passes per iteration,
tokens generated and re-prefilled (a carried row's prompt is its prompt + tokens so far), the fraction of trained
rows that were continued, the mean token age (iterations); the rows the drain finished.

TARGET: the best partial N >= 1.4x plain throughput at the judged engine setting (the first of --caps;
default max_num_seqs 8, bench_rollout_balance's). Other --caps are measured and reported, not judged.
Exits 1 and prints FAIL when the target is missed.

--quick: 14M model, 16 prompts per iteration (the full run's judged workload: with 8 the engines run more
tail-bound, and a quick run measured partial N=2 at 1.22x plain where the full table has 0.96x), 3 iterations, one
repeat, N in {2, 4}, cap 8 (~3 min); writes nothing under benchmarks/results/. Full: 16 prompts, 6 iterations,
3 repeats, N in {2, 4, 8}, caps 8 and 64; writes benchmarks/results/bench_partial_rollout.{md,json}.

Usage:
    python benchmarks/bench_partial_rollout.py [--quick] [--repeats R] [--iters I] [--prompts G] [--splits 2,4]
        [--caps 8,64] [--prefix-caching] [--out-dir DIR]
"""
import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_rollout_balance as rb  # noqa: E402
from bench_rollout import MODEL_SMALL, build_models  # noqa: E402
from bench_rollout_balance import ENGINES, MAX_TOKENS, SAMPLES, cell, draw_round  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TARGET_GAIN = 1.4
POOL = 2  # partial rollout's pool holds POOL x global_batch_size prompts: it draws POOL - 1 batches more than plain
MAX_MODEL_LEN = 1024  # prompt (<= 64) + max_tokens (512) fits


# ---------------------------------------------------------------- workload


def batch_stream(seed: int, vocab: int, prompts: int):
    """Prompt batches b = 0, 1, ... of one repeat: (prompts, natural lengths per prompt [n]), the same for every
    way. bench_rollout_balance's draw_round draws 16 prompts; the first ``prompts`` of them are kept."""
    b = 0
    while True:
        rows, lengths, _ = draw_round(np.random.default_rng(seed * 1000 + b), vocab)
        firsts = rows[::SAMPLES][:prompts]
        yield firsts, lengths.reshape(-1, SAMPLES)[:prompts]
        b += 1


# ---------------------------------------------------------------- engines (Ray actors)


def engine_class():
    """A rollout engine on one core: the worker's VLLMRollout, as is (per-row budgets come in the rollout_budget
    column). bench_rollout_balance's Engine sizes rows by overriding VLLMRollout._params(sampling, seed, eos_id),
    a signature without the budget argument that serve now passes, so it cannot be reused here."""
    import ray

    @ray.remote(num_cpus=1)
    class Engine:
        def __init__(self, core: int, model: str, cap: int, prefix_caching: bool):
            os.sched_setaffinity(0, [core])
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
            import torch
            from types import SimpleNamespace
            from mindspeed_rl.plan.rollout_spec import RolloutSpec
            from mindspeed_rl.models.causal_lm import CausalLMEngine
            from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout
            torch.set_num_threads(1)
            actor = CausalLMEngine(model, torch.device("cpu"), dtype=torch.float32, trainable=False)
            # a step's token budget holds every live row's whole prompt: no chunked prefill (vLLM's CPU build
            # fails on a seeded row whose prefill is chunked: "CPU Generator does not use offset"), and a carried
            # row's prompt (its prompt + tokens so far, up to MAX_MODEL_LEN) is prefilled in one step
            spec = RolloutSpec("vllm", "benchmark", dtype="float32", max_num_seqs=cap, max_model_len=MAX_MODEL_LEN,
                               max_num_batched_tokens=cap * MAX_MODEL_LEN, enable_prefix_caching=prefix_caching)
            self.rollout = VLLMRollout(spec, actor, model, torch.device("cpu"), rank=core, world_size=ENGINES,
                                       seed=0)
            self.sampling = SimpleNamespace(max_tokens=MAX_TOKENS, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)

        def ready(self):
            return True

        def serve(self, queue, key, consumer, prompts, budgets, seeds):
            import torch
            from mindspeed_rl.models.rollout.base import ROLLOUT_BUDGET
            from mindspeed_rl.workers.rollout_source import RaySource
            inputs = {"prompts": [torch.tensor(p) for p in prompts], ROLLOUT_BUDGET: [int(b) for b in budgets]}
            source = RaySource(queue, key, consumer, list(range(len(prompts))), inputs,
                               deadline=time.monotonic() + 1800)
            served = self.rollout.serve(source, self.sampling, lambda row: seeds[row], None, None, None)
            return {"busy": served.busy, "rows": served.rows, "responses": [r.tolist() for r in served.responses],
                    "steps": len(served.trace)}

    return Engine


class Harness:
    """Two engines and the queue; ``run_pass`` is one rollout round (what a trainer's rollout stage runs)."""

    def __init__(self, model: str, cap: int, prefix_caching: bool):
        import ray
        from mindspeed_rl.balance.rollout_queue import RolloutQueue
        Engine = engine_class()
        start = time.perf_counter()
        self.engines = [Engine.remote(core, model, cap, prefix_caching) for core in range(ENGINES)]
        self.queue = ray.remote(num_cpus=0)(RolloutQueue).remote()
        ray.get([e.ready.remote() for e in self.engines])
        self.startup = time.perf_counter() - start
        self.key = 0

    def run_pass(self, prompts, budgets, seeds, groups, prior=None):
        """(wall seconds, slowest engine's busy seconds, responses in row order, engine steps)."""
        import ray
        self.key += 1
        start = time.perf_counter()
        ray.get(self.queue.load.remote(self.key, len(prompts), ENGINES, None, None, groups, prior))
        served = ray.get([e.serve.remote(self.queue, self.key, c, prompts, budgets, seeds)
                          for c, e in enumerate(self.engines)])
        wall = time.perf_counter() - start
        made = {r: m for s in served for r, m in zip(s["rows"], s["responses"])}
        if sorted(made) != list(range(len(prompts))):
            raise RuntimeError(f"pass {self.key}: {len(made)} of {len(prompts)} rows came back")
        return wall, max(s["busy"] for s in served), [made[r] for r in range(len(prompts))], \
            sum(s["steps"] for s in served)

    def close(self):
        import ray
        for e in self.engines:
            ray.kill(e)
        ray.kill(self.queue)


# ---------------------------------------------------------------- the ways


def new_record():
    """Per iteration after the warm-up: its figures; ``warmup``: the warm-up iteration's seconds and rows;
    ``drain``: the passes after the last iteration that finish the pool (partial rollout only)."""
    return {"rollout_s": [], "busy_s": [], "passes": [], "steps": [], "tokens": [], "prefill": [],
            "continued": [], "age": [], "rows": [], "warmup": {"rollout_s": 0.0, "rows": 0},
            "drain": {"rollout_s": 0.0, "rows": 0, "passes": 0, "left_rows": 0}}


def run_plain(h: Harness, stream, iters: int, seed: int):
    """Yields its record after every iteration (the warm-up one included), then after its drain: the POOL - 1
    batches partial rollout drew beyond the iterations (its pool's top-up), rolled out too, so that both ways
    finish the same prompts."""
    rec = new_record()

    def one_batch(it):
        prompts, lengths = next(stream)
        rows = [p for p in prompts for _ in range(SAMPLES)]
        budgets = lengths.reshape(-1).tolist()
        groups = (np.arange(len(rows)) // SAMPLES).tolist()
        seeds = [seed * 10_000_000 + it * 10_000 + r for r in range(len(rows))]
        wall, busy, made, steps = h.run_pass(rows, budgets, seeds, groups)
        if [len(m) for m in made] != budgets:
            raise RuntimeError("plain: a row's response length differs from its budget")
        return rows, budgets, wall, busy, steps

    for it in range(iters + 1):
        rows, budgets, wall, busy, steps = one_batch(it)
        if it == 0:
            rec["warmup"] = {"rollout_s": wall, "rows": len(rows)}
        else:  # after the warm-up iteration
            rec["rollout_s"].append(wall)
            rec["busy_s"].append(busy)
            rec["passes"].append(1)
            rec["steps"].append(steps)
            rec["tokens"].append(int(sum(budgets)))
            rec["prefill"].append(int(sum(len(p) for p in rows)))
            rec["continued"].append(0.0)
            rec["age"].append(0.0)
            rec["rows"].append(len(rows))
        yield rec
    drain = {"rollout_s": 0.0, "rows": 0, "passes": 0, "left_rows": 0}  # nothing carried; the batches partial drew
    for extra in range(POOL - 1):
        rows, _, wall, _, _ = one_batch(iters + 1 + extra)
        drain["rollout_s"] += wall
        drain["rows"] += len(rows)
        drain["passes"] += 1
    rec["drain"] = drain
    yield rec


def run_partial(h: Harness, stream, iters: int, split: int, prompts_per_iter: int, seed: int):
    """The trainer's loop (trainer/partial_rollout.py step) around CarryPool, with the engines' EOS emulated;
    yields its record after every iteration (the warm-up one included)."""
    import torch
    from mindspeed_rl.plan.partial_rollout import PartialSpec
    from mindspeed_rl.models.rollout.base import ROLLOUT_BUDGET
    from mindspeed_rl.trainer.utils.carry_pool import CarryPool
    from mindspeed_rl.utils.token_ids import TOKEN_DTYPE
    spec = PartialSpec(split, MAX_TOKENS, prompts_per_iter, POOL * prompts_per_iter)
    eos = MODEL_SMALL["vocab_size"]  # out of the vocabulary: never sampled, only written at a row's natural end
    pool = CarryPool(SAMPLES, spec.max_tokens, spec.pass_tokens, eos, extra_columns=("natural",))

    def add():
        prompts, lengths = next(stream)
        pool.add({"prompts": [torch.tensor(p) for p in prompts], "natural": [torch.tensor(x) for x in lengths]})

    def natural(indexes):
        """Each pool row's natural length: its group's lengths, by its place among the group's rows (a group's
        rows keep their order in the pool and leave it together)."""
        seen, place = {}, []
        for r in pool.rows:
            place.append(seen.get(r["group"], 0))
            seen[r["group"]] = place[-1] + 1
        return [int(pool.rows[i]["extra"]["natural"][place[i]]) for i in indexes]

    rec, passes_total = new_record(), 0

    def one_pass(it):
        """A pass over the pool's incomplete rows; (wall s, busy s, engine steps, tokens made, prompt tokens)."""
        nonlocal passes_total
        rows = pool.pass_rows()
        inputs = pool.pass_inputs(rows)
        done = [pool.rows[i]["tokens"].numel() for i in rows]
        lengths = natural(rows)
        budgets = [min(int(b), n - d) for b, n, d in zip(inputs[ROLLOUT_BUDGET], lengths, done)]
        if min(budgets) <= 0:
            raise RuntimeError("partial: an incomplete row has reached its natural length")
        groups, prior = pool.pass_groups(rows)
        seeds = [seed * 10_000_000 + passes_total * 10_000 + k for k in range(len(rows))]
        passes_total += 1
        prompts = [p.tolist() for p in inputs["prompts"]]
        wall, busy, made, st = h.run_pass(prompts, budgets, seeds, groups, prior)
        if [len(m) for m in made] != budgets:
            raise RuntimeError("partial: a row's response length differs from its budget")
        responses = []
        for m, n, d in zip(made, lengths, done):
            new = torch.tensor(m, dtype=TOKEN_DTYPE)
            if d + new.numel() >= n:
                new[-1] = eos  # the row's natural end: as if the engine had sampled EOS here
            responses.append(new)
        pool.extend(rows, responses, None, it)
        return wall, busy, st, sum(budgets), sum(len(p) for p in prompts)

    for it in range(iters + 1):
        add()
        while pool.groups + spec.train_prompts <= spec.pool_prompts:
            add()
        wall_sum = busy_sum = 0.0
        passes = steps = tokens = prefill = 0
        while len(pool.complete_groups()) < spec.train_prompts:
            wall, busy, st, made_tokens, prompt_tokens = one_pass(it)
            wall_sum += wall
            busy_sum += busy
            passes += 1
            steps += st
            tokens += made_tokens
            prefill += prompt_tokens
        columns, metrics = pool.take(spec.train_prompts, it)
        if it == 0:  # the pool fills from empty: its work on rows trained later counts in the drained figure
            rec["warmup"] = {"rollout_s": wall_sum, "rows": len(columns["prompts"])}
        else:
            n_rows = len(columns["prompts"])
            rec["rollout_s"].append(wall_sum)
            rec["busy_s"].append(busy_sum)
            rec["passes"].append(passes)
            rec["steps"].append(steps)
            rec["tokens"].append(tokens)
            rec["prefill"].append(prefill)
            rec["continued"].append(metrics["partial_rollout/continued_rows"] / n_rows)
            rec["age"].append(metrics["partial_rollout/token_age_mean"])
            rec["rows"].append(n_rows)
            rec.setdefault("trained_tokens", []).append(int(columns["response_length"].sum()))
        yield rec
    # the drain: no new prompts, passes until every row left in the pool is complete, every group trained
    drain = {"rollout_s": 0.0, "rows": 0, "passes": 0, "left_rows": len(pool.rows)}
    while pool.rows:
        if pool.pass_rows():
            drain["rollout_s"] += one_pass(iters + 1)[0]
            drain["passes"] += 1
        complete = pool.complete_groups()
        if complete:
            drain["rows"] += len(pool.take(len(complete), iters + 1)[0]["prompts"])
    rec["drain"] = drain
    yield rec


# ---------------------------------------------------------------- report


def summarize(rec: dict) -> dict:
    """``throughput``: rows / s from an empty pool to an empty pool (the warm-up iteration and the drain count);
    ``throughput_left``: the iterations after the warm-up only, the pool left as it is (flatters a short run)."""
    s = sum(rec["rollout_s"])
    if "drain" in rec:
        every_s = s + rec["warmup"]["rollout_s"] + rec["drain"]["rollout_s"]
        every_rows = sum(rec["rows"]) + rec["warmup"]["rows"] + rec["drain"]["rows"]
        drained = {"throughput": every_rows / every_s, "left_rows": rec["drain"]["left_rows"],
                   "drain_s": rec["drain"]["rollout_s"]}
    else:  # a record saved before the drain (--render): only the pool-left figure exists
        drained = {"throughput": None, "left_rows": None, "drain_s": None}
    return {**drained, "throughput_left": sum(rec["rows"]) / s,
            "rollout_s_iter": s / len(rec["rollout_s"]),
            "busy_s_iter": sum(rec["busy_s"]) / len(rec["busy_s"]),
            "passes_iter": statistics.mean(rec["passes"]), "steps_iter": statistics.mean(rec["steps"]),
            "tokens_iter": statistics.mean(rec["tokens"]), "prefill_iter": statistics.mean(rec["prefill"]),
            "continued": statistics.mean(rec["continued"]), "age": statistics.mean(rec["age"]),
            "rows": sum(rec["rows"]), "zero_pass_iters": sum(p == 0 for p in rec["passes"])}


def occupancy(summary: dict, cap: int) -> float:
    """Tokens made / (engine steps x max_num_seqs): 1 when every step of both engines ran a full batch (the
    engines are throughput-bound), low when steps ran few rows (a long tail of a few rows)."""
    return summary["tokens_iter"] / (summary["steps_iter"] * cap) if summary["steps_iter"] else float("nan")


def ways_of(splits):
    return ["plain"] + [f"partial N={n}" for n in splits]


def table(res: dict) -> str:
    lines = ["| cap | way | rows / s (pool drained) | vs plain | rows / s (pool left) | vs plain (pool left) | "
             "rows in the pool at the end | rollout s / iter | passes / iter | engine steps / iter | "
             "tokens made / iter | prompt tokens prefilled / iter | slot occupancy | trained rows continued | "
             "token age |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for cap, c in res["caps"].items():
        reps = c["repeats"]
        for way in ways_of(res["splits"]):
            got = [r[way]["summary"] for r in reps]
            gain = [ratio(r, way, "throughput") for r in reps]
            left = [ratio(r, way, "throughput_left") for r in reps]
            lines.append(f"| {cap} | {way} | {cell([g['throughput'] for g in got], '{:.1f}')} | "
                         f"{cell(gain, '{:.2f}x')} | {cell([g['throughput_left'] for g in got], '{:.1f}')} | "
                         f"{cell(left, '{:.2f}x')} | {cell([g['left_rows'] for g in got], '{:.0f}')} | "
                         f"{cell([g['rollout_s_iter'] for g in got])} | "
                         f"{cell([g['passes_iter'] for g in got], '{:.1f}')} | "
                         f"{cell([g['steps_iter'] for g in got], '{:.0f}')} | "
                         f"{cell([g['tokens_iter'] for g in got], '{:.0f}')} | "
                         f"{cell([g['prefill_iter'] for g in got], '{:.0f}')} | "
                         f"{cell([occupancy(g, int(cap)) for g in got], '{:.0%}')} | "
                         f"{cell([g['continued'] for g in got], '{:.0%}')} | {cell([g['age'] for g in got])} |")
    return "\n".join(lines)


def ratio(rep: dict, way: str, key: str):
    """``way``'s figure ``key`` over plain's in one repeat (None where the record has no such figure)."""
    mine, plain = rep[way]["summary"][key], rep["plain"]["summary"][key]
    return None if mine is None or plain is None else mine / plain


def gains(res: dict, cap: str) -> dict:
    """Each partial way's rows/s over plain's, median over repeats: from an empty pool to an empty pool, or (a record
    saved before the drain) the pool left as it was."""
    reps = res["caps"][cap]["repeats"]
    return {way: statistics.median(ratio(r, way, judged_key(reps)) for r in reps) for way in ways_of(res["splits"])[1:]}


def judged_key(reps: list) -> str:
    """The judged rows/s: drained, unless the records predate the drain (--render of an older .json)."""
    return "throughput" if all(r["plain"]["summary"]["throughput"] is not None for r in reps) else "throughput_left"


def make_targets(res: dict) -> list:
    out = []
    for i, cap in enumerate(res["caps"]):
        g = gains(res, cap)
        best = max(g, key=g.get)
        detail = (f"max_num_seqs {cap}: best {best} = {g[best]:.2f}x plain rows/s (" +
                  ", ".join(f"{w}: {v:.2f}x" for w, v in g.items()) + f"); target >= {TARGET_GAIN:.2f}x")
        out.append((f"throughput cap {cap}", g[best] >= TARGET_GAIN, i == 0, detail))
    return out


def report(res: dict, targets: list) -> str:
    caps = res["caps"]
    parts = ["# Partial rollout vs plain rollout on CPU (vLLM, DP=2)", "",
             f"Machine: {res['cpus']} cores; load average before {res['load_before'][0]:.1f}, after "
             f"{res['load_after'][0]:.1f}. Model {res['model']} (float32), {ENGINES} vLLM engines, one core each, "
             f"prefix caching {'on' if res['prefix_caching'] else 'off'}. Iterations of {res['prompts']} prompts x "
             f"{SAMPLES} samples, max_tokens {MAX_TOKENS}; natural response lengths lognormal (median {rb.MEDIAN}, "
             f"sigma {rb.SIGMA}, {rb.MIN_TOKENS}..{MAX_TOKENS}), {rb.SHARED:.0%} of the log-variance shared by a "
             f"prompt's samples, EOS emulated at the natural length. {res['iters']} iterations after 1 warm-up, "
             f"{res['repeats']} repeat(s); medians (min-max) over repeats. Partial: pool of up to "
             f"{POOL * res['prompts']} prompts, ceil({MAX_TOKENS}/N) new tokens per row per pass.", "",
             table(res), "",
             "rows / s (pool drained; judged): rows trained / rollout seconds (wall time of the passes) from an empty "
             "pool to an empty pool: the warm-up iteration counts, and after the last iteration partial rollout "
             "drains its pool (no new prompts, passes until every row is complete; the rows it held are the column "
             "after) and plain rolls out the batch the pool drew beyond the iterations: both finish the same "
             "prompts. rows / s (pool left): the iterations after the warm-up only, the pool left as it is: the "
             "rows carried past the end are paid for only up to where they were cut and the warm-up's work is free, "
             "which flatters partial rollout in a short run. vs plain: the median over "
             "repeats of rows/s over the same repeat's plain rows/s; the other columns are per iteration after the "
             "warm-up. tokens made: new tokens "
             "generated; prompt tokens prefilled: the passes' prompt tokens (a carried row re-sends its prompt + "
             "tokens so far). slot occupancy: tokens made / (engine steps x max_num_seqs), summed over both "
             "engines. token age: mean iterations between a trained token's sampling and its training.", ""]
    for cap, c in caps.items():
        parts.append(f"max_num_seqs {cap}: engine start-up {c['startup_s']:.0f} s, measured in {c['wall_s']:.0f} s.")
    parts += ["", "## Targets", "", "| target | status | detail |", "|---|---|---|"]
    parts += [f"| {name} | {('PASS' if ok else 'FAIL') if judged else ('info: pass' if ok else 'info: miss')} | "
              f"{detail} |" for name, ok, judged, detail in targets]
    parts += ["", "## Why", ""] + notes(res)
    parts += ["", f"Command: `{res['command']}`. Wall time: {res['wall_s']:.0f} s."]
    return "\n".join(parts) + "\n"


def notes(res: dict) -> list:
    """The reading of the table, from its numbers."""
    out = []
    for cap, c in res["caps"].items():
        reps, g = c["repeats"], gains(res, cap)
        plain = [r["plain"]["summary"] for r in reps]
        occ = statistics.median(occupancy(p, int(cap)) for p in plain)
        best = max(g, key=g.get)
        zero = sum(r[w]["summary"]["zero_pass_iters"] for r in reps for w in g)
        out.append(f"- max_num_seqs {cap}: plain rollout keeps {occ:.0%} of the engines' slots busy per step "
                   f"(median over repeats; 60 % or more read as throughput-bound); the best partial way, {best}, "
                   f"reaches {g[best]:.2f}x its rows/s. "
                   + ("The engines are throughput-bound: the long tail is run while other rows fill the free slots, "
                      "so cutting it into passes saves few steps, and every carried row pays its prompt + tokens so "
                      "far again as prefill (the prompt-token column) and the passes add queue rounds."
                      if occ >= 0.6 else
                      "The engines are tail-bound: most steps run far fewer rows than the engine holds, and a step's "
                      "fixed cost (bench_rollout_balance fits ~2.5 ms per step against ~0.2 ms per row for this "
                      "model) is paid whatever few rows it runs; passes of at most ceil(max_tokens / N) tokens cut the "
                      "steps per iteration (the engine-steps column), while the carried rows' re-prefill (the "
                      "prompt-token column, growing with N) and every row's per-token cost stay: the gain is the "
                      "step cost saved less the prefill added.")
                   + (f" {zero} measured partial iteration(s) ran no pass: the pool already held enough complete "
                      f"groups." if zero else ""))
        if judged_key(reps) == "throughput":
            left = statistics.median(ratio(r, best, "throughput_left") for r in reps)
            held = statistics.median(r[best]["summary"]["left_rows"] for r in reps)
            out.append(f"- max_num_seqs {cap}: {best} still held {held:.0f} rows after the last iteration; with them "
                       f"left unfinished and the warm-up's work free it would read {left:.2f}x instead of "
                       f"{g[best]:.2f}x.")
    if len(res["caps"]) > 1:
        med = {(cap, way): statistics.median(r[way]["summary"][judged_key(c["repeats"])] for r in c["repeats"])
               for cap, c in res["caps"].items() for way in ways_of(res["splits"])}
        plain = max((k for k in med if k[1] == "plain"), key=med.get)
        part = max((k for k in med if k[1] != "plain"), key=med.get)
        out.append(f"- Across the engine settings: the best plain rollout is {med[plain]:.1f} rows/s (max_num_seqs "
                   f"{plain[0]}), the best partial rollout {med[part]:.1f} rows/s ({part[1]}, max_num_seqs "
                   f"{part[0]}): {med[part] / med[plain]:.2f}x (medians of different runs, not paired).")
    out.append("- Token age is about one iteration even where few trained rows were continued: the pool holds up to "
               "2 x global_batch_size prompts and trains the oldest complete groups first, so a group completed in "
               "a pass usually waits for the next iteration's take (partial rollout as specified, not a fault).")
    out.append("- The engines' step token budget is max_num_seqs x max_model_len (no chunked prefill): with 2048, "
               "vLLM's CPU build failed at max_num_seqs 64 (\"RuntimeError: CPU Generator does not use offset\" in "
               "gpu_model_runner._bookkeeping_sync, a seeded row whose prefill was chunked).")
    return out


def render(path: Path) -> int:
    """Re-render the .md from a saved .json (the report's wording changes, the numbers stay)."""
    res = json.loads(path.read_text())
    for c in res["caps"].values():
        for row in c["repeats"]:
            for way in row.values():
                way["summary"] = summarize(way["record"])
    targets = make_targets(res)
    text = report(res, targets)
    path.with_suffix(".md").write_text(text)
    print(text)
    return 1 if any(judged and not ok for _, ok, judged, _ in targets) else 0


# ---------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=None, help="global_batch_size (prompts per iteration)")
    parser.add_argument("--splits", default=None, help="partial_rollout_max_split values, e.g. 2,4")
    parser.add_argument("--caps", default=None, help="max_num_seqs per engine; the first is judged, e.g. 8,64")
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--render", default=None, help="re-render the .md of this saved .json; runs nothing")
    args = parser.parse_args()
    if args.render:
        return render(Path(args.render))
    repeats = args.repeats or (1 if args.quick else 3)
    iters = args.iters or (3 if args.quick else 6)
    prompts = args.prompts or 16  # --quick too: the full run's judged workload (see the module's doc)
    if not 1 <= prompts <= rb.PROMPTS:
        parser.error(f"--prompts must be 1..{rb.PROMPTS} (bench_rollout_balance's draw)")
    splits = [int(x) for x in (args.splits or ("2,4" if args.quick else "2,4,8")).split(",")]
    caps = [int(x) for x in (args.caps or ("8" if args.quick else "8,64")).split(",")]
    out_dir = Path(args.out_dir) if args.out_dir else (Path(tempfile.mkdtemp(prefix="bench_pr_")) if args.quick
                                                      else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    res = {"quick": args.quick, "load_before": os.getloadavg(), "cpus": os.cpu_count(), "model": "14M",
           "prompts": prompts, "iters": iters, "repeats": repeats, "splits": splits,
           "prefix_caching": args.prefix_caching, "caps": {},
           "command": "python benchmarks/bench_partial_rollout.py " + " ".join(sys.argv[1:])}
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray
    with tempfile.TemporaryDirectory(prefix="pr_") as tmp:
        model = build_models(tmp, with_150m=False)["14M"]
        vocab = MODEL_SMALL["vocab_size"]
        init_ray(num_cpus=ENGINES + 1)
        try:
            for cap in caps:
                t0 = time.perf_counter()
                h = Harness(model, cap, args.prefix_caching)
                # engine warm-up (not timed): first steps compile and allocate
                warm = [list(range(1, 20))] * 16
                h.run_pass(warm, [8] * 16, list(range(16)), list(range(16)))
                reps = []
                for rep in range(repeats):
                    ways = ways_of(splits)
                    runs = {way: run_plain(h, batch_stream(rep, vocab, prompts), iters, rep) if way == "plain" else
                            run_partial(h, batch_stream(rep, vocab, prompts), iters, int(way.split("=")[1]), prompts,
                                        rep) for way in ways}
                    recs = {}
                    for it in range(iters + 1):  # the ways take turns, an iteration each (a load that changes
                        for way in ways[it % len(ways):] + ways[:it % len(ways)]:  # over time hits them alike)
                            recs[way] = next(runs[way])
                    for way in ways:  # the drain: the rows partial rollout still carries are finished and counted
                        recs[way] = next(runs[way])
                    row = {}
                    for way in ways:
                        row[way] = {"record": recs[way], "summary": summarize(recs[way])}
                        s = row[way]["summary"]
                        print(f"cap {cap} repeat {rep} {way:14s}: {s['throughput']:.1f} rows/s drained "
                              f"({s['throughput_left']:.1f} pool left, {s['left_rows']} rows drained), "
                              f"{s['rollout_s_iter']:.2f} s/iter, {s['passes_iter']:.1f} passes/iter, "
                              f"{s['tokens_iter']:.0f} tokens/iter, continued {s['continued']:.0%}", flush=True)
                    reps.append(row)
                h.close()
                res["caps"][str(cap)] = {"startup_s": h.startup, "repeats": reps,
                                         "wall_s": time.perf_counter() - t0}
        finally:
            shutdown_ray()
    res["load_after"] = os.getloadavg()
    res["wall_s"] = time.perf_counter() - start
    targets = make_targets(res)
    text = report(res, targets)
    print(text)
    if not args.quick or args.out_dir:
        (out_dir / "bench_partial_rollout.md").write_text(text)
        (out_dir / "bench_partial_rollout.json").write_text(json.dumps(res, indent=1, default=str))
    print("== TARGETS ==")
    for name, ok, judged, detail in targets:
        print(f"{name:22s}: {('PASS' if ok else 'FAIL') if judged else ('info' + (' pass' if ok else ' miss'))}"
              f"  {detail}")
    failed = [name for name, ok, judged, _ in targets if judged and not ok]
    if failed:
        print(f"targets FAILED: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
