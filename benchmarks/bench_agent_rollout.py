"""Multi-turn agent rollout with tools on CPU: the blocking loop vs vLLM's continuous path, vLLM, DP=2.

Two vLLM engines (float32, Ray actors, each pinned to its own core with os.sched_setaffinity and
VLLM_CPU_OMP_THREADS_BIND: an idle engine does not lend its core to the other) serve rounds of 16 prompts x 8
samples (4 with --quick) through the workers' own code: AgentLoop (turn rule, ToolRunner beside the engine, tool
blocks), VLLMRollout, RolloutQueue in a Ray actor read through RaySource. The model is a small random one
(bench_rollout's 14M shape with the byte-level text tokenizer's 259 ids as vocabulary: 9.9M parameters), so tool
calls come from a script: each row has 0..3 tool
rounds (drawn per row), each model turn a length (lognormal, drawn per (row, turn), EOS ignored) and each tool call
a latency (lognormal, median 0.3 s, clipped to 3 s, drawn per (row, turn)) that the tool sleeps (asyncio). The
scripted parser returns one call for the turns the script says call a tool ((row, turn) read from the
conversation as the agent reads the turn), whatever the text; the tokens are the engine's.

Ways, on the same rows and seeds in each repeat:
- blocking: serve_blocking (agent_serve.py, the transformers path) driven with VLLMRollout.generate: each engine
  takes a chunk of rows (the queue in chunk mode, rows_per_share rows, as the workers load it for transformers),
  generates every active row's turn, waits for all their tools, then the next turn;
- continuous: VLLMRollout.serve -> serve_conversations (vllm_agent.py) over the RolloutQueue actor (continuous
  takes of at most rows_per_share rows, first takes of max_num_seqs answered with the load, as the launcher does):
  a turn waiting on its tool frees its slot; its next turn rejoins the same engine between steps;
- continuous_free: the same over a queue loaded with handoff (rl_config.multi_turn_routing=free): a conversation
  whose tool round finished goes back to the queue with its engine's next take and its next turn runs on the
  engine running fewest rows (its prompt and response so far prefilled there);
- continuous_static (full run only): the same serve path over a static split (the seeded random half of the rows
  per engine, a LocalSource over a queue of the engine's own rows, as a fixed share runs in the workers).

Figures per way, medians (min-max) over repeats: stage (slowest engine's serve seconds), each engine's busy
fraction (seconds in engine.step / add_request, or in generate for the blocking loop, over the stage), the busy
fraction while tools run (per engine, over the time at least one of its rows waits on a tool; pooled), tool
seconds per row, the share of an engine's serve time during which a tool of its rows runs, the seconds an engine
idled with every row it holds on a tool, the bound (max of the mean engine busy seconds and the longest
conversation's critical path: its turns' seconds in the engine plus its tool seconds), stage / bound, the
speed-up over blocking, turns and tool calls per row, and the rows whose response (tokens and tool blocks) is
identical to the blocking loop's.

Targets (issue 47), judged on the way of the default routing (plan/multi_turn.py DEFAULT_ROUTING: continuous
for sticky, continuous_free for free): engine busy fraction while tools run >= 80 %; stage within 10 % of its
bound; >= 1.3x faster than blocking; and the default routing's stage at most 5 % over the other routing's (median
of the repeats' ratios): the default is the routing that measures better. Prints markdown tables and a TARGETS block; exits 1 when a
target printed as FAIL fails. --quick: 16 prompts x 4 samples, 3 repeats, blocking, continuous and continuous_free (~3-4 min
on a busy machine); writes nothing under benchmarks/results/. A full run (16 x 8, 5 repeats, all three ways, ~15
min on 2 cores) writes benchmarks/results/bench_agent_rollout.{md,json}.

Usage:
    python benchmarks/bench_agent_rollout.py [--quick] [--repeats N] [--max-num-seqs N] [--out-dir DIR]
                                             [--target-scale X]
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

from bench_rollout import MODEL_SMALL  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ENGINES = 2
PROMPT_RANGE = (16, 64)
ROUNDS_P = (0.2, 0.3, 0.3, 0.2)  # P(a row makes 0, 1, 2, 3 tool rounds)
TURN_MEDIAN, TURN_SIGMA, TURN_MIN, TURN_MAX = 40, 0.8, 8, 192  # a model turn's tokens (EOS ignored)
TOOL_MEDIAN, TOOL_SIGMA, TOOL_MIN, TOOL_MAX = 0.3, 0.9, 0.02, 3.0  # a tool call's seconds
MAX_MODEL_LEN = 1024
TARGETS = {"busy_tools": 0.80, "gap": 0.10, "gain": 1.3}
WAYS = ("blocking", "continuous", "continuous_free", "continuous_static")
ROUTED = {"sticky": "continuous", "free": "continuous_free"}  # the way of each multi_turn_routing
ROUTING_SLACK = 0.05  # the default routing's stage may be this much over the other's (noise)


# ---------------------------------------------------------------- workload


def draw_round(seed: int, prompts: int, samples: int) -> dict:
    """One round: each row's prompt, tool rounds, turn lengths and tool seconds (per (row, turn) seeded)."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(PROMPT_RANGE[0], PROMPT_RANGE[1] + 1, prompts)
    texts = [rng.integers(0, 256, n).tolist() for n in lens]  # byte ids of the text tokenizer
    n = prompts * samples
    rounds = rng.choice(len(ROUNDS_P), size=n, p=ROUNDS_P)
    lengths, tools = [], []
    for row in range(n):
        one = np.random.default_rng((seed, row))
        z = one.normal(0.0, 1.0, (int(rounds[row]) + 1, 2))
        lengths.append(np.clip(np.round(TURN_MEDIAN * np.exp(TURN_SIGMA * z[:, 0])), TURN_MIN, TURN_MAX)
                       .astype(int).tolist())
        tools.append(np.clip(TOOL_MEDIAN * np.exp(TOOL_SIGMA * z[:-1, 1]), TOOL_MIN, TOOL_MAX).round(3).tolist())
    return {"prompts": [texts[r // samples] for r in range(n)], "groups": [r // samples for r in range(n)],
            "lengths": lengths, "tools": tools}


# ---------------------------------------------------------------- intervals


def merged(spans):
    """The union of (start, end) spans as sorted disjoint spans."""
    out = []
    for a, b in sorted((float(a), float(b)) for a, b in spans if b > a):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def length(spans) -> float:
    return sum(b - a for a, b in merged(spans))


def overlap(one, two) -> float:
    """Seconds covered by both unions."""
    x, y, i, j, total = merged(one), merged(two), 0, 0, 0.0
    while i < len(x) and j < len(y):
        total += max(0.0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


# ---------------------------------------------------------------- engines (Ray actors)


def engine_class():
    import ray

    @ray.remote(num_cpus=1)
    class Engine:
        """One rollout engine pinned to one core: VLLMRollout with per-(row, turn) max_tokens (by seed), timed."""

        def __init__(self, core: int, model: str, cap: int):
            os.sched_setaffinity(0, [core])
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
            from types import SimpleNamespace

            import torch
            from mindspeed_rl.plan.rollout_spec import RolloutSpec
            from mindspeed_rl.models.causal_lm import CausalLMEngine
            from mindspeed_rl.models.rollout.vllm_backend import VLLMRollout
            from mindspeed_rl.models.tiny_text_tokenizer import build_text_tokenizer
            torch.set_num_threads(1)
            self.table, self.calls = {}, []
            table, calls = self.table, self.calls

            class Timed(VLLMRollout):
                def _params(self, sampling, seed, eos_id, budget=None):
                    params = super()._params(sampling, seed, eos_id, budget)
                    params.max_tokens = table[int(seed)]
                    return params

                def generate(self, prompts, sampling, seeds, eos_id, pad_id, budgets=None):
                    start = time.monotonic()
                    out = super().generate(prompts, sampling, seeds, eos_id, pad_id, budgets)
                    calls.append((start, time.monotonic(), [int(s) for s in seeds]))
                    return out
            actor = CausalLMEngine(model, torch.device("cpu"), dtype=torch.float32, trainable=False)
            spec = RolloutSpec("vllm", "benchmark", dtype="float32", max_num_seqs=cap, max_model_len=MAX_MODEL_LEN,
                               max_num_batched_tokens=2048)
            self.rollout = Timed(spec, actor, model, torch.device("cpu"), rank=core, world_size=ENGINES, seed=0)
            self.tokenizer = build_text_tokenizer()
            self.sampling = SimpleNamespace(max_tokens=TURN_MAX + 1, temperature=1.0, top_p=1.0, top_k=-1, min_p=0.0)
            self.core, self.cap = core, cap

        def where(self):
            import mindspeed_rl
            return {"core": self.core, "affinity": sorted(os.sched_getaffinity(0)),
                    "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), "package": mindspeed_rl.__file__}

        def run(self, way, rnd, base, order, queue=None, key=None, consumer=0, first=None):
            """Serve ``order``'s rows of round ``rnd`` one way; row r samples with seed ``base + r``. ``queue``:
            the RolloutQueue actor (None: a queue of ``order`` in this process, as a fixed share runs)."""
            import torch
            from mindspeed_rl.models.rollout.agent_serve import serve_blocking, turn_seed
            from mindspeed_rl.balance.rollout_queue import LocalSource, RolloutQueue
            from mindspeed_rl.workers.rollout_source import RaySource
            which = {}
            self.table.clear()
            for row in order:
                for turn, tokens in enumerate(rnd["lengths"][row]):
                    seed = turn_seed(base + row, turn)
                    self.table[seed], which[seed] = int(tokens), (row, turn)
            del self.calls[:]
            tool_spans, steps, turns = [], [], {}
            agent = scripted_agent(self.tokenizer, rnd, tool_spans)
            inputs = {"prompts": [torch.tensor(rnd["prompts"][r]) for r in order]}
            if queue is None:
                local = RolloutQueue()
                local.load("share", len(order), 1, cap=len(order))
                source = LocalSource(local, 0, list(order), inputs)
            else:
                source = RaySource(queue, key, consumer, list(order), inputs, deadline=time.monotonic() + 1800,
                                   first=first)
            seed_of = lambda row: base + row  # noqa: E731
            engine = self.rollout.llm.llm_engine
            timer = self.rollout.llm.llm_engine = StepTimer(engine, steps, turns, self.cap)
            try:
                if way == "blocking":
                    served = serve_blocking(self.rollout, agent, source, self.sampling, seed_of, None, None,
                                            len(order), clock=time.monotonic)
                else:
                    self.rollout.agent = agent
                    served = self.rollout.serve(source, self.sampling, seed_of, None, None, None,
                                                clock=time.monotonic)
            finally:
                self.rollout.llm.llm_engine, self.rollout.agent = engine, None
                agent.close()
            if way == "blocking":
                steps = [(a, b) for a, b, _ in self.calls]
                turns = {which[s]: (a, b) for a, b, seeds in self.calls for s in seeds}
            else:
                turns = {tuple(int(x) for x in rid[3:].split("t")): span for rid, span in turns.items()}
            return {"stage": served.busy, "tool_wait": served.tool_wait, "rows": served.rows,
                    "responses": [r.tolist() for r in served.responses], "stats": served.turn_stats,
                    "steps": timer.steps, "live": timer.live, "busy_spans": steps, "tool_spans": tool_spans,
                    "turn_spans": [(r, t, a, b) for (r, t), (a, b) in turns.items()]}

    return Engine


class StepTimer:
    """vLLM's LLMEngine with its add_request and step calls timed (the engine's busy spans) and each request's
    admission and finish times."""

    def __init__(self, engine, spans: list, requests: dict, cap: int):
        self._engine, self._spans, self._requests, self._cap = engine, spans, requests, cap
        self.steps, self.live = 0, 0  # steps, and the requests they ran (summed; at most max_num_seqs a step)

    def add_request(self, request_id, *args, **kwargs):
        start = time.monotonic()
        out = self._engine.add_request(request_id, *args, **kwargs)
        self._spans.append((start, time.monotonic()))
        self._requests[request_id] = [start, None]
        return out

    def step(self):
        self.steps += 1
        self.live += min(self._engine.get_num_unfinished_requests(), self._cap)
        start = time.monotonic()
        outputs = self._engine.step()
        end = time.monotonic()
        self._spans.append((start, end))
        for out in outputs:
            if out.finished and out.request_id in self._requests:
                self._requests[out.request_id][1] = end
        return outputs

    def __getattr__(self, name):
        return getattr(self._engine, name)


class SleepTool:
    """A tool in BaseTool's async shape whose call sleeps the scripted seconds; records (row, turn, start, end)."""

    def __init__(self, spans: list):
        self.spans = spans

    async def acreate(self, instance_id=None, **kwargs):
        return instance_id or "wait"

    async def aexecute(self, instance_id, parameters, **kwargs):
        import asyncio
        start = time.monotonic()
        await asyncio.sleep(float(parameters["seconds"]))
        self.spans.append((int(parameters["row"]), int(parameters["turn"]), start, time.monotonic()))
        return f"waited {float(parameters['seconds']):.3f} s", 0.0, {}

    async def arelease(self, instance_id, **kwargs):
        return None


class ScriptedParser:
    """One call of the 'wait' tool on the turns the round's script says call one, whatever the text: the turn is
    ``current`` ((row, turn), set by the agent before it parses)."""

    def __init__(self, tools: list):
        self.tools, self.current = tools, None

    def parse_text(self, text):
        from types import SimpleNamespace
        row, turn = self.current
        if turn >= len(self.tools[row]):
            return [], []
        args = {"row": row, "turn": turn, "seconds": self.tools[row][turn]}
        return [SimpleNamespace(name="wait", arguments=json.dumps(args))], []


def scripted_agent(tokenizer, rnd: dict, tool_spans: list):
    """AgentLoop with the sleep tool and the scripted parser (told each turn's (row, turn) before it parses)."""
    from types import SimpleNamespace

    from mindspeed_rl.agent.agent_loop import AgentLoop

    class Scripted(AgentLoop):
        def after_turn(self, conv, ids, log_probs=None, ended=True):
            self.parser.current = (conv.row, conv.turns)
            return super().after_turn(conv, ids, log_probs, ended)
    spec = SimpleNamespace(max_tool_calls=len(ROUNDS_P) - 1, max_parallel_calls=1, call_timeout=60.0,
                           max_total_response_length=MAX_MODEL_LEN - PROMPT_RANGE[1], max_tool_response_length=0,
                           truncate_side="middle")
    # a turn's budget above the longest scripted turn: every turn ends short of it, as at its EOS
    return Scripted(spec, {"wait": SleepTool(tool_spans)}, tokenizer, ScriptedParser(rnd["tools"]), TURN_MAX + 1)


# ---------------------------------------------------------------- one round, every way


def run_round(engines, queue, key: int, rnd: dict, base: int, seed: int, cap: int, ways=WAYS) -> tuple:
    import ray
    from mindspeed_rl.balance.balance_plan import BalancePlanner
    n = len(rnd["prompts"])
    order, per = list(range(n)), -(-n // ENGINES)
    out = {}
    for way in ways:
        if way == "continuous_static":
            split = BalancePlanner(seed=seed).random_split(n, ENGINES)
            refs = [e.run.remote(way, rnd, base, [int(r) for r in share]) for e, share in zip(engines, split)]
        else:
            key += 1
            chunk, take_cap = (per, None) if way == "blocking" else (None, per)
            firsts = ray.get(queue.load.remote(key, n, ENGINES, chunk, take_cap, rnd["groups"], None, cap,
                                               handoff=way == "continuous_free"))
            refs = [e.run.remote(way, rnd, base, order, queue, key, c, firsts[c]) for c, e in enumerate(engines)]
        out[way] = ray.get(refs)
    return out, key


def measure(args) -> dict:
    """Start the engines, a warm-up round, then ``repeats`` rounds of every way; raw records per repeat."""
    import ray
    from transformers import AutoModelForCausalLM, Qwen2Config

    import torch
    from mindspeed_rl.models.tiny_text_tokenizer import TEXT_VOCAB_SIZE
    from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray
    from mindspeed_rl.balance.rollout_queue import RolloutQueue
    res = {"quick": args.quick, "cpus": os.cpu_count(), "load_before": os.getloadavg(), "prompts": args.prompts,
           "samples": args.samples, "max_num_seqs": args.max_num_seqs, "ways": list(args.ways), "repeats": []}
    with tempfile.TemporaryDirectory(prefix="agent_bench_") as tmp:
        shape = dict(MODEL_SMALL, vocab_size=TEXT_VOCAB_SIZE)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(Qwen2Config(**shape))
        res["params"] = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp)
        init_ray(num_cpus=ENGINES + 1)
        try:
            Engine = engine_class()
            start = time.perf_counter()
            engines = [Engine.remote(core, tmp, args.max_num_seqs) for core in range(ENGINES)]
            queue = ray.remote(num_cpus=0)(RolloutQueue).remote()
            res["engines"] = ray.get([e.where.remote() for e in engines])
            res["startup_s"] = time.perf_counter() - start
            warm = draw_round(10_000, 4, 2)  # not timed: the engines' first steps compile and allocate
            _, key = run_round(engines, queue, 0, warm, 7_000_000, 10_000, args.max_num_seqs, args.ways)
            for rep in range(args.repeats):
                rnd = draw_round(rep, args.prompts, args.samples)
                print(f"... repeat {rep + 1}/{args.repeats}", flush=True)
                got, key = run_round(engines, queue, key, rnd, 100_000 * (rep + 1), rep, args.max_num_seqs,
                                     args.ways)
                res["repeats"].append({"round": {k: rnd[k] for k in ("lengths", "tools")}, "ways": got})
            for e in engines:
                ray.kill(e)
            ray.kill(queue)
        finally:
            shutdown_ray()
    res["load_after"] = os.getloadavg()
    return res


# ---------------------------------------------------------------- figures


def way_figures(engines: list, lengths: list, reference=None) -> dict:
    """One way's figures in one repeat from its engines' records (``lengths``: each row's scripted turn
    lengths)."""
    stage_e = [e["stage"] for e in engines]
    stage = max(stage_e)
    busy_e = [sum(b - a for a, b in e["busy_spans"]) for e in engines]
    tools_e = [[(a, b) for _, _, a, b in e["tool_spans"]] for e in engines]
    waiting = [length(t) for t in tools_e]
    covered = [overlap(e["busy_spans"], t) for e, t in zip(engines, tools_e)]
    path = {}
    for e in engines:
        for r, _, a, b in e["turn_spans"]:
            path[r] = path.get(r, 0.0) + (b - a)
        for r, _, a, b in e["tool_spans"]:
            path[r] = path.get(r, 0.0) + (b - a)
    bound = max(float(np.mean(busy_e)), max(path.values()) if path else 0.0)
    stats = [s for e in engines for s in e["stats"]]
    rows = len(stats)
    out = {"stage": stage, "stage_per_engine": stage_e, "busy": [b / stage for b in busy_e],
           "engine_s": float(np.mean(busy_e)), "imbalance": max(busy_e) / float(np.mean(busy_e)) - 1,
           # each engine's seconds per generated token: the cores' speed under their outside load
           "ms_per_token": [1e3 * b / max(sum(sum(lengths[r]) for r in e["rows"]), 1) for b, e in zip(busy_e, engines)],
           "steps": float(np.mean([e["steps"] for e in engines])),
           "live_per_step": sum(e["live"] for e in engines) / max(sum(e["steps"] for e in engines), 1),
           "busy_while_tools": sum(covered) / sum(waiting) if sum(waiting) > 0 else None,
           "busy_while_tools_per_engine": [c / w if w > 0 else None for c, w in zip(covered, waiting)],
           "tool_s_per_row": sum(b - a for t in tools_e for a, b in t) / max(rows, 1),
           "tool_share": float(np.mean([w / s for w, s in zip(waiting, stage_e)])),
           "idle_on_tools": [e["tool_wait"] for e in engines], "bound": bound, "gap": stage / bound - 1 if bound
           else None, "turns_per_row": sum(s["turns"] for s in stats) / max(rows, 1),
           "tool_calls_per_row": sum(s["tool_calls"] for s in stats) / max(rows, 1),
           "moved_per_row": sum(s.get("moved", 0) for s in stats) / max(rows, 1),
           "rows_per_engine": [len(e["rows"]) for e in engines], "rows": rows,
           "tool_errors": sum(s["tool_errors"] + s["tool_timeouts"] for s in stats),
           "stops": sorted({s["stop"] for s in stats})}
    responses = {r: x for e in engines for r, x in zip(e["rows"], e["responses"])}
    if reference is not None:
        out["identical"] = sum(responses.get(r) == x for r, x in reference.items()) / max(len(reference), 1)
    out["_responses"] = responses
    return out


def analyse(res: dict) -> dict:
    """Figures per repeat and way; the speed-up over blocking."""
    figures = []
    for rep in res["repeats"]:
        ways = rep["ways"]
        lengths = rep["round"]["lengths"]
        block = way_figures(ways["blocking"], lengths)
        one = {"blocking": block}
        for way in [w for w in WAYS[1:] if w in ways]:
            one[way] = way_figures(ways[way], lengths, block["_responses"])
        block["identical"] = 1.0
        # the gain from removing the blocking loop's idle on tools alone, with the same engine seconds
        block["idle_gain"] = block["stage"] / block["engine_s"]
        expect = sum(len(t) for t in rep["round"]["tools"]) / len(rep["round"]["tools"])
        for way, f in one.items():
            f.pop("_responses")
            f["speedup"] = block["stage"] / f["stage"]
            f["scripted_calls_per_row"] = expect
        figures.append(one)
    return {"figures": figures}


# ---------------------------------------------------------------- report


def cell(values, fmt="{:.2f}") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def med(figures, way, key):
    values = [f[way][key] for f in figures if f[way][key] is not None]
    return statistics.median(values) if values else None


def tables(figures) -> list:
    pct, ways = "{:.0%}", [w for w in WAYS if w in figures[0]]

    def col(way, key, fmt="{:.2f}"):
        return cell([f[way][key] for f in figures], fmt)

    def per(way, key, fmt="{:.2f}"):  # engine 0 / engine 1
        return " / ".join(cell([f[way][key][i] for f in figures], fmt) for i in range(ENGINES))
    lines = ["| way | stage s | bound s | stage / bound - 1 | blocking / this | engine busy s (mean) | busy "
             "imbalance | busy (e0 / e1) | busy while tools run | tool s per row | tool running, share of stage | "
             "idle on tools s (e0 / e1) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in ways:
        lines.append(f"| {w} | {col(w, 'stage')} | {col(w, 'bound')} | {col(w, 'gap', '{:.1%}')} | "
                     f"{col(w, 'speedup', '{:.2f}x')} | {col(w, 'engine_s')} | {col(w, 'imbalance', '{:.1%}')} | "
                     f"{per(w, 'busy', pct)} | {col(w, 'busy_while_tools', '{:.1%}')} | {col(w, 'tool_s_per_row')} | "
                     f"{col(w, 'tool_share', pct)} | {per(w, 'idle_on_tools')} |")
    lines += ["", "| way | turns per row | tool calls per row | turns moved per row | tool errors | engine steps | "
              "sequences per step | engine ms per generated token (e0 / e1) | rows per engine | rows identical to "
              "blocking | stop reasons |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in ways:
        lines.append(f"| {w} | {col(w, 'turns_per_row')} | {col(w, 'tool_calls_per_row')} | "
                     f"{col(w, 'moved_per_row')} | "
                     f"{col(w, 'tool_errors', '{:.0f}')} | {col(w, 'steps', '{:.0f}')} | "
                     f"{col(w, 'live_per_step', '{:.1f}')} | {per(w, 'ms_per_token')} | "
                     f"{'; '.join('/'.join(map(str, f[w]['rows_per_engine'])) for f in figures)} | "
                     f"{col(w, 'identical', '{:.0%}')} | "
                     f"{', '.join(sorted({s for f in figures for s in f[w]['stops']}))} |")
    return lines


def routing_ratio(figures, default: str):
    """Median over the repeats of the default routing's stage / the other routing's (None: not both measured)."""
    mine, other = ROUTED[default], ROUTED["free" if default == "sticky" else "sticky"]
    ratios = [f[mine]["stage"] / f[other]["stage"] for f in figures if mine in f and other in f]
    return statistics.median(ratios) if ratios else None


def make_targets(figures, scale: float = 1.0, default: str = None) -> list:
    """(name, PASS/FAIL, detail): the issue's three judged on the medians of the default routing's way, a check that
    every way did the same work (the scripted tool calls, the blocking loop's responses), and that the default
    routing is the one that measures better (within ROUTING_SLACK)."""
    from mindspeed_rl.plan.multi_turn import DEFAULT_ROUTING
    default = default or DEFAULT_ROUTING
    JUDGED = ROUTED[default]
    busy, gap, gain = (med(figures, JUDGED, k) for k in ("busy_while_tools", "gap", "speedup"))
    want_busy, want_gap, want_gain = min(TARGETS["busy_tools"] * scale, 1.0), TARGETS["gap"] / scale, \
        TARGETS["gain"] * scale
    blocked, idle_gain = med(figures, "blocking", "busy_while_tools"), med(figures, "blocking", "idle_gain")
    off = [f"{way} in repeat {i + 1}" for i, f in enumerate(figures) for way, w in f.items()
           if w["identical"] < 1 or w["tool_errors"] or w["stops"] != ["answered"]
           or abs(w["tool_calls_per_row"] - w["scripted_calls_per_row"]) > 1e-9]
    return [("busy while tools", busy is not None and busy >= want_busy,
             f"{JUDGED}: engines busy {busy:.1%} of the time a row of theirs waits on a tool (blocking "
             f"{blocked:.1%}); target >= {want_busy:.0%}"),
            ("bound", gap is not None and gap <= want_gap,
             f"{JUDGED}: stage {gap:.1%} over its bound; target <= {want_gap:.0%}"),
            ("speed", gain is not None and gain >= want_gain,
             f"blocking / {JUDGED} stage = {gain:.2f}x; target >= {want_gain:.2f}x" + (
                 f" (removing the idle on tools alone gives {idle_gain:.2f}x here, see above)" if gain < want_gain
                 else "")),
            ("same work", not off, "every way ran the scripted turns and tool calls (no tool error, every "
             "conversation answered) and made the blocking loop's responses token for token" if not off else
             "turns or tool calls off the script, tool errors or responses unlike the blocking loop's: "
             + ", ".join(off))] + routing_target(figures, default)


def routing_target(figures, default: str) -> list:
    ratio = routing_ratio(figures, default)
    if ratio is None:
        return []
    other = "free" if default == "sticky" else "sticky"
    return [("routing", ratio <= 1 + ROUTING_SLACK,
             f"default multi_turn_routing={default}: its stage / {other}'s = {ratio:.3f} (median of the repeats); "
             f"target <= {1 + ROUTING_SLACK:.2f}")]


def idle_note(figures) -> str:
    spread = cell([f["blocking"]["idle_gain"] for f in figures], "{:.2f}x")
    return (f"Blocking stage / its mean engine busy seconds = {spread}: the speed-up from removing the blocking "
            "loop's idle on tools alone, with the same engine work. On CPU a step costs ~2.5 ms + 0.2 ms per "
            "sequence (bench_rollout_balance's fit at 14M), so a turn's tail run at a small batch costs the blocking "
            "loop only the fixed part of its extra steps (engine steps above); on a GPU a step costs about the same "
            "at 1 or 64 sequences, so the tail costs it far more and the gain of continuous batching is larger. "
            "The engines' seconds also grow with the machine's load while the tools' do not: the busier the "
            "machine, the smaller the tools' share and the gain.")


def report(res: dict, figures: list, targets: list) -> str:
    n = res["prompts"] * res["samples"]
    bind = "; ".join(f"engine {e['core']}: affinity {e['affinity']}, VLLM_CPU_OMP_THREADS_BIND={e['omp_bind']}"
                     for e in res["engines"])
    title = "# Multi-turn agent rollout with tools on CPU: blocking vs continuous, sticky vs free routing"
    parts = [title + (" (--quick)" if res["quick"] else ""), "",
             f"Machine: {res['cpus']} cores; load average before {res['load_before'][0]:.1f}, after "
             f"{res['load_after'][0]:.1f} (other processes share these cores: spreads include them). {ENGINES} vLLM "
             f"engines (float32, {res['params'] / 1e6:.1f}M-parameter random model), one core each ({bind}); "
             f"max_num_seqs {res['max_num_seqs']}; engine start-up {res['startup_s']:.0f} s.",
             "", f"Workload: rounds of {res['prompts']} prompts x {res['samples']} samples ({n} rows; prompts "
             f"{PROMPT_RANGE[0]}-{PROMPT_RANGE[1]} tokens); tool rounds per row 0/1/2/3 with p = "
             f"{'/'.join(map(str, ROUNDS_P))}; model turn lengths lognormal (median {TURN_MEDIAN}, sigma "
             f"{TURN_SIGMA}, {TURN_MIN}..{TURN_MAX} tokens, EOS ignored); tool seconds lognormal (median "
             f"{TOOL_MEDIAN}, sigma {TOOL_SIGMA}, {TOOL_MIN}..{TOOL_MAX} s, an asyncio sleep). Medians (min-max) "
             f"over {len(figures)} repeats, each a new round.", "",
             "Ways: blocking = serve_blocking over VLLMRollout.generate, rows from the queue actor in chunks of "
             f"{-(-n // ENGINES)} (each engine generates all its active rows' turn, waits for all their tools, then "
             "the next turn); continuous = VLLMRollout.serve -> serve_conversations, rows from the RolloutQueue "
             "actor (continuous takes); continuous_static (full run only) = the same serve path over a static seeded "
             "random split (a LocalSource per engine); continuous_free = continuous over a queue loaded with "
             "handoff (rl_config.multi_turn_routing=free): the turn after a tool round goes back to the queue and "
             "runs on the engine running fewest rows (turns moved per row: turns run on another engine than the "
             "turn before).", "",
             "Sequences per step: requests in the engine at a step, at most max_num_seqs. Engine ms per generated "
             "token: an engine's busy seconds (prefills included) over the tokens its rows generated; a gap between "
             "e0 and e1 is the cores' unequal outside load. "
             "Busy: an engine's seconds in engine.step/add_request (blocking: in generate) over the stage (the "
             "slowest engine's serve seconds). Busy while tools run: per engine, the share of the time at least one "
             "of its rows waits on a tool during which the engine steps (pooled over engines). Bound: max(mean engine "
             "busy seconds, the longest conversation's critical path = its turns' seconds in the engine + its tool "
             "seconds), from the way's own measurements; it lets engine work move freely between engines, which "
             "sticky turns do not: the turns of rows an engine took before the queue drained stay on it (busy "
             "imbalance: slowest engine's busy seconds / mean - 1, part of stage / bound - 1; the cores' unequal "
             "outside load adds to it). Idle on tools: seconds an engine waited with every row it holds on a tool.", "",
             *tables(figures), "", idle_note(figures), "", "## Targets", "",
             "| target | status | detail |", "|---|---|---|"]
    parts += [f"| {name} | {'PASS' if ok else 'FAIL'} | {detail} |" for name, ok, detail in targets]
    parts += ["", f"Wall time: {res['wall_s']:.0f} s."]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 prompts x 4 samples, 3 repeats, blocking, "
                                                             "continuous and continuous_free (~4-5 min)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 3 with --quick, else 5)")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="each engine's max_num_seqs")
    parser.add_argument("--out-dir", default=None, help="where the .md/.json go (default benchmarks/results; "
                                                        "--quick: a temp folder)")
    parser.add_argument("--target-scale", type=float, default=1.0,
                        help="tighten every target by this factor (to see the FAIL path)")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.max_num_seqs < 1:
        parser.error(f"--max-num-seqs must be >= 1, got {args.max_num_seqs}")
    if not args.target_scale > 0:
        parser.error(f"--target-scale must be > 0, got {args.target_scale:g}")
    args.repeats = args.repeats or (3 if args.quick else 5)
    args.prompts, args.samples = 16, (4 if args.quick else 8)
    args.ways = WAYS[:3] if args.quick else WAYS
    out_dir = Path(args.out_dir or (tempfile.mkdtemp(prefix="bench_agent_") if args.quick else RESULTS))
    start = time.perf_counter()
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    res = measure(args)
    res["wall_s"] = time.perf_counter() - start
    res.update(analyse(res))
    targets = make_targets(res["figures"], args.target_scale)
    res["targets"] = [{"name": n, "status": "PASS" if ok else "FAIL", "detail": d} for n, ok, d in targets]
    text = report(res, res["figures"], targets)
    print(text)
    out_dir.mkdir(parents=True, exist_ok=True)
    for rep in res["repeats"]:  # the raw spans stay out of the JSON; the figures are in it
        rep.pop("ways", None)
    (out_dir / "bench_agent_rollout.md").write_text(text)
    (out_dir / "bench_agent_rollout.json").write_text(json.dumps(res, indent=1))
    print(f"wrote {out_dir / 'bench_agent_rollout.md'} and {out_dir / 'bench_agent_rollout.json'}")
    print("== TARGETS ==")
    for name, ok, detail in targets:
        print(f"{name:18s}: {'PASS' if ok else 'FAIL'}  {detail}")
    failed = [name for name, ok, _ in targets if not ok]
    if failed:
        print(f"targets FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
