"""The rollout queue's balance figures for one round, from what its consumers measured.

Each consumer reports its busy seconds, the rows it made with their latencies, and its engine's trace records.
From them: the imbalance over the engines (slowest busy time / mean - 1), the bound (max of the mean busy time
and the longest row; no split of the round ends earlier) and the distance to it; and, replayed through the step
cost fitted to the same records (rollout_cost.py), what the static split (a seeded random split into fixed
shares, ``rl_config.rollout_balance: static``) would have taken on the same rows, next to the replayed queue (how close
the replay comes to the measured round). A multi-turn round (consumers report ``tools``: seconds their rows waited
on tools, and those the engine stepped meanwhile) adds the engines' busy fraction while tools ran and the tools'
share of the stage; it is not replayed (the step cost knows no tool time).

Whether the imbalance is a signal at all: a round where every engine made one take (one chunk each, or every row
joined its engine's batch at once) is the static split, whatever the figures say (``balanced_takes`` 0); a round
whose engines were busy for milliseconds measures timer and scheduling noise (``busy_mean_s`` under
``MIN_MEASURED_BUSY_S``). ``measured`` is 1 only when neither holds; ``rollout_note`` says which for the line.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mindspeed_rl.balance.rollout_cost import CHUNKS, CONTINUOUS, balance_bound, fit_step_cost, simulate_queue, \
    simulate_static
from mindspeed_rl.balance.seqlen_balancing import balance_key, imbalance


# Mean engine busy seconds under which the line reports no imbalance: a take's round trip to the queue actor
# (about 1 ms on loopback Ray) and a scheduler time slice on a shared host (a few ms) move an engine's busy time
# by about 5 ms; under 50 ms that is over 10 %, as large as what the queue removes (static 6-11 % in
# benchmarks/results/bench_rollout_balance.md).
MIN_MEASURED_BUSY_S = 0.05


def engine_takes(trace: dict, chunked: bool) -> int:
    """The takes one engine made of the round: its trace's ``takes`` (the worker's queue source counts the answers
    that brought rows or turns), else its records: one generate per take (chunks), one step where new prompt
    tokens joined per take (continuous batching)."""
    if "takes" in trace:
        return int(trace["takes"])
    records = np.asarray(trace["trace"], dtype=np.float64).reshape(-1, 4)
    return int(len(records)) if chunked else int((records[:, 2] > 0).sum())


def rollout_note(metrics: Dict[str, float], name: str) -> Optional[str]:
    """Why the queued stage ``name``'s imbalance is no signal in ``metrics`` (one round's figures, or several
    rounds' means), for the iteration line; None when it is one (or the figures predate the flags)."""
    takes, busy = metrics.get(balance_key(name, "balanced_takes")), metrics.get(balance_key(name, "busy_mean_s"))
    if takes is not None and takes == 0:
        return "nothing to balance (1 take per engine)"
    if busy is not None and busy < MIN_MEASURED_BUSY_S:
        return f"too short to measure (engines busy {busy * 1e3:.0f} ms, under {MIN_MEASURED_BUSY_S * 1e3:.0f} ms)"
    return None


def static_calls(split: Sequence[Sequence[int]], engines: int) -> List[List[List[int]]]:
    """The static split's generate calls per engine: share s is one call on engine s % ``engines``."""
    calls: List[List[List[int]]] = [[] for _ in range(engines)]
    for s, share in enumerate(split):
        calls[s % engines].append([int(r) for r in share])
    return calls


def queue_figures(name: str, order: Sequence[int], prompt_lengths, response_lengths, traces: Sequence[dict],
                  consumers: int, chunk, take_cap, max_num_seqs: int, static_split: Sequence[Sequence[int]],
                  groups=None, prior=None) -> Tuple[Dict[str, float], dict]:
    """(metrics, balance plan record) of one queued round. ``traces``: per consumer that returned rows,
    ``consumer``, ``rows``, ``busy``, ``latency`` (per row) and ``trace`` records; ``chunk``: rows per
    generate (transformers) or None (continuous batching of at most ``max_num_seqs`` rows, takes of at most
    ``take_cap``); ``static_split``: the rows of each share of the static split."""
    busy, rows, takes = np.zeros(consumers), np.zeros(consumers, dtype=np.int64), np.zeros(consumers, dtype=np.int64)
    tools = np.zeros((consumers, 2)) if any("tools" in t for t in traces) else None
    latency, records = [], []
    for t in traces:
        c = int(t["consumer"])
        busy[c], rows[c], takes[c] = float(t["busy"]), len(t["rows"]), engine_takes(t, bool(chunk))
        if tools is not None:
            tools[c] = t.get("tools", (0.0, 0.0))
        latency += [float(x) for x in t["latency"]]
        records.append(np.asarray(t["trace"], dtype=np.float64).reshape(-1, 4))
    stage, bound = float(busy.max()), balance_bound(busy, latency)
    key = lambda stat: balance_key(name, stat)  # noqa: E731
    metrics = {key("rank_imbalance"): imbalance(busy), key("stage_s"): stage, key("bound_s"): bound,
               key("bound_gap"): stage / bound - 1.0 if bound > 0 else 0.0}
    for c in range(consumers):
        metrics[key(f"rank{c}")] = float(busy[c])
        metrics[key(f"rows/rank{c}")] = float(rows[c])
        metrics[key(f"takes/rank{c}")] = float(takes[c])
    # the takes after each engine's first went to whichever engine asked: the queue's own decisions
    balanced = float(np.maximum(takes - 1, 0).sum())
    mean_busy = float(busy.mean())
    metrics.update({key("balanced_takes"): balanced, key("busy_mean_s"): mean_busy,
                    key("measured"): float(balanced > 0 and mean_busy >= MIN_MEASURED_BUSY_S)})
    plan = {"consumer": name, "objective": "seconds", "balanced": True, "served": "queue",
            "loads": busy.tolist(), "random_loads": busy.tolist(), "sizes": rows.tolist(), "lower_bound": bound}
    if tools is not None:
        running = float(tools[:, 0].sum())
        if running > 0:
            metrics[key("busy_while_tools")] = float(tools[:, 1].sum()) / running
        metrics[key("tool_share")] = running / float(busy.sum()) if busy.sum() > 0 else 0.0
        plan["tools"] = {"running": tools[:, 0].tolist(), "busy": tools[:, 1].tolist()}
    records = np.concatenate(records) if records else np.zeros((0, 4))
    if tools is not None or not len(records) or not (records[:, 3] > 0).any():
        return metrics, plan  # nothing timed, or tool time the step cost cannot replay: no replay
    cost = fit_step_cost(records)
    mode = CHUNKS if chunk else CONTINUOUS
    static = simulate_static(prompt_lengths, response_lengths, static_calls(static_split, consumers), cost, mode,
                             cap=max_num_seqs)
    replay = simulate_queue(prompt_lengths, response_lengths, order, consumers, cost, mode, cap=max_num_seqs,
                            chunk=chunk, take_cap=take_cap, groups=groups, prior=prior)
    metrics.update({key("static_s"): static.stage, key("static_gain"): static.stage / stage if stage > 0 else 1.0,
                    key("replay_s"): replay.stage, key("replay_error"): replay.stage / stage - 1.0 if stage else 0.0,
                    key("cost_per_step_ms"): cost.per_step * 1e3, key("cost_per_seq_ms"): cost.per_seq * 1e3,
                    key("cost_per_prefill_token_ms"): cost.per_prefill_token * 1e3})
    plan["random_loads"] = static.busy.tolist()
    return metrics, plan


def rollout_figures(dock, stage, queued, traces: Sequence[dict]) -> Tuple[Dict[str, float], dict]:
    """``queue_figures`` of the dock's round ``queued`` (a QueueRound, after the rollout's put): its lengths,
    the run plan's queue settings and the static split the dock's planner draws for this round."""
    plan = dock.run_plan
    served = {int(r) for t in traces for r in t["rows"]}
    # a round that stopped early (async_engine) is replayed on the rows it served
    kept = [i for i, r in enumerate(queued.order) if r in served]
    order = [queued.order[i] for i in kept]
    groups, prior = [queued.groups[i] for i in kept], [queued.prior[i] for i in kept]
    chunk, take_cap = plan.rollout_takes(stage)
    n = len(order)
    consumers = plan.rollout_consumers
    n_shares = max(1, n // stage.rows_per_share)
    # the replay indexes rows 0 .. n-1: the served rows' lengths in queue order
    split = [np.asarray(s) for s in dock.planner.random_split(n, n_shares)]
    prompt = dock.experience_lengths["prompt_length"][order].numpy()
    response = dock.experience_lengths["response_length"][order].numpy()
    return queue_figures(stage.name, list(range(n)), prompt, response, traces, consumers, chunk, take_cap,
                         plan.worker.rollout.max_num_seqs, split, groups, prior)
