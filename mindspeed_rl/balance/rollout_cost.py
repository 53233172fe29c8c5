"""What a rollout round costs an engine, fitted from its own steps, and replayed for other splits.

An engine step costs ``a + b * live + c * prefill`` seconds: ``live`` sequences each make one token, and
``prefill`` prompt tokens enter the batch in that step. A trace record is ``(steps, live, prefill, seconds)``:
one vLLM step is ``(1, live, prefill, dt)``; one transformers ``generate`` over a chunk is ``(longest response,
chunk rows, rows * widest prompt, dt)`` (every row stays in the batch until the longest one ends).

The replay (``simulate``) runs engines on given response lengths, either each on its own fixed rows (a static
split) or all pulling from one queue (``RolloutQueue``'s rule: free slots, at most a fair share of what is
left); it returns every engine's busy time and every row's latency, from which a round's imbalance and its
bound (max of the mean busy time and the longest row) follow. Pure numpy and heapq: lengths in, seconds out.
"""
import heapq
import itertools
import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence

import numpy as np

CONTINUOUS, CHUNKS = "continuous", "chunks"
MODES = (CONTINUOUS, CHUNKS)


@dataclass(frozen=True)
class StepCost:
    """Seconds of one engine step: ``per_step + per_seq * live + per_prefill_token * prefill``."""
    per_step: float
    per_seq: float
    per_prefill_token: float

    def of(self, steps, live, prefill):
        """Seconds of ``steps`` steps with ``live`` sequences and ``prefill`` new prompt tokens."""
        return steps * (self.per_step + self.per_seq * live) + self.per_prefill_token * prefill


def _features(records: np.ndarray) -> np.ndarray:
    steps, live, prefill = records[:, 0], records[:, 1], records[:, 2]
    return np.stack([steps, steps * live, prefill], axis=1)


def fit_step_cost(records) -> StepCost:
    """Least-squares ``StepCost`` of trace records ``(steps, live, prefill, seconds)``, every coefficient
    >= 0 (the best fit over the subsets of terms whose unconstrained fit is non-negative)."""
    records = np.asarray(records, dtype=np.float64).reshape(-1, 4)
    if not len(records):
        raise ValueError("fit_step_cost: no trace records")
    if not np.isfinite(records).all() or (records < 0).any():
        raise ValueError("fit_step_cost: trace records must be finite and non-negative")
    x, y = _features(records), records[:, 3]
    best, best_err = np.zeros(3), np.inf
    for size in (1, 2, 3):
        for cols in itertools.combinations(range(3), size):
            coef = np.linalg.lstsq(x[:, cols], y)[0]
            if (coef < 0).any():
                continue
            err = float(np.sum((x[:, cols] @ coef - y) ** 2))
            if err < best_err * (1 - 1e-12):  # a larger set of terms only where it fits better
                best, best_err = np.zeros(3), err
                best[list(cols)] = coef
    return StepCost(*(float(v) for v in best))


class Replay(NamedTuple):
    """A simulated round: each engine's busy seconds and rows, each row's start and finish seconds."""
    busy: np.ndarray      # per engine
    rows: List[List[int]]  # per engine, in the order taken
    start: np.ndarray     # per row (nan: not run)
    finish: np.ndarray    # per row

    @property
    def stage(self) -> float:
        return float(self.busy.max()) if self.busy.size else 0.0

    @property
    def latency(self) -> np.ndarray:
        return self.finish - self.start

    @property
    def bound(self) -> float:
        """max(mean busy, longest row): no split of this work ends earlier (``balance_bound``)."""
        return balance_bound(self.busy, self.latency)


def balance_bound(busy, latency) -> float:
    """A round's bound: the mean of the engines' busy times, or its longest row, whichever is larger."""
    busy = np.asarray(busy, dtype=np.float64)
    latency = np.asarray(latency, dtype=np.float64)
    latency = latency[np.isfinite(latency)]
    return max(float(busy.mean()) if busy.size else 0.0, float(latency.max()) if latency.size else 0.0)


class _Engine:
    """One engine of the replay: live rows finish at a step number; the clock advances event by event."""

    def __init__(self, cost: StepCost):
        self.cost = cost
        self.clock, self.step = 0.0, 0
        self.live: list = []   # heap of (finish step, row)
        self.prefill = 0       # prompt tokens admitted since the last step
        self.rows: List[int] = []
        self.admitted = {}     # row -> the step it was admitted at
        self.finished: List[int] = []  # rows finished since the engine last reported

    def admit(self, rows, prompt, resp, start):
        for r in rows:
            heapq.heappush(self.live, (self.step + max(1, int(resp[r])), r))
            self.admitted[r] = self.step
            self.prefill += int(prompt[r])
            start[r] = self.clock
            self.rows.append(r)

    def advance(self, finish) -> None:
        """Run to the next finishing step."""
        until = self.live[0][0]
        self.clock += self.cost.of(until - self.step, len(self.live), self.prefill)
        self.step, self.prefill = until, 0
        while self.live and self.live[0][0] == until:
            row = heapq.heappop(self.live)[1]
            finish[row] = self.clock
            self.finished.append(row)

    def run_chunk(self, rows, prompt, resp, start, finish):
        """One transformers generate over ``rows``: every row stays until the longest ends."""
        width = max(int(prompt[r]) for r in rows)
        steps = max(max(1, int(resp[r])) for r in rows)
        for r in rows:
            start[r] = self.clock
        self.clock += self.cost.of(steps, len(rows), width * len(rows))
        for r in rows:
            finish[r] = self.clock
        self.rows += list(rows)


def _lengths(prompt_lens, response_lens):
    prompt = np.asarray(prompt_lens, dtype=np.int64).reshape(-1)
    resp = np.asarray(response_lens, dtype=np.int64).reshape(-1)
    if prompt.shape != resp.shape:
        raise ValueError(f"simulate: {prompt.size} prompt lengths, {resp.size} response lengths")
    return prompt, resp


def _check_mode(mode: str, cap: int):
    if mode not in MODES:
        raise ValueError(f"simulate: mode must be one of {MODES}, got {mode!r}")
    if mode == CONTINUOUS and (cap is None or cap < 1):
        raise ValueError(f"simulate: continuous batching needs cap >= 1 (max_num_seqs), got {cap!r}")


def simulate_static(prompt_lens, response_lens, calls: Sequence[Sequence[Sequence[int]]], cost: StepCost,
                    mode: str = CONTINUOUS, cap: Optional[int] = None) -> Replay:
    """Each engine e runs its own generate calls ``calls[e]`` (each a list of row ids) one after the other:
    a call is continuous batching of at most ``cap`` live rows, or (``chunks``) one transformers generate."""
    prompt, resp = _lengths(prompt_lens, response_lens)
    _check_mode(mode, cap)
    start, finish = np.full(prompt.size, np.nan), np.full(prompt.size, np.nan)
    engines = [_Engine(cost) for _ in calls]
    for engine, mine in zip(engines, calls):
        for call in mine:
            call = [int(r) for r in call]
            if not call:
                continue
            if mode == CHUNKS:
                engine.run_chunk(call, prompt, resp, start, finish)
                continue
            pending = list(reversed(call))
            engine.admit([pending.pop() for _ in range(min(cap, len(pending)))], prompt, resp, start)
            while engine.live:
                engine.advance(finish)
                free = cap - len(engine.live)
                engine.admit([pending.pop() for _ in range(min(free, len(pending)))], prompt, resp, start)
    return Replay(np.array([e.clock for e in engines]), [e.rows for e in engines], start, finish)


def simulate_queue(prompt_lens, response_lens, order: Sequence[int], consumers: int, cost: StepCost,
                   mode: str = CONTINUOUS, cap: Optional[int] = None, chunk: Optional[int] = None,
                   take_cap: Optional[int] = None, groups=None, prior=None) -> Replay:
    """``consumers`` engines pull ``order`` (row ids) from one ``RolloutQueue`` (balance/rollout_queue.py, the
    queue the workers use: ``groups`` and ``prior`` per position as its ``load`` takes them): continuous
    engines ask for their free slots after every finishing step and report their rows' progress; chunked
    engines take the next chunk when their generate ends. Ties go to the lower engine index."""
    from mindspeed_rl.balance.rollout_queue import RolloutQueue
    prompt, resp = _lengths(prompt_lens, response_lens)
    _check_mode(mode, cap)
    if mode == CHUNKS and (chunk is None or chunk < 1):
        raise ValueError(f"simulate: chunks need chunk >= 1 rows, got {chunk!r}")
    _positive_count("consumers", consumers)
    order = [int(r) for r in order]
    start, finish = np.full(prompt.size, np.nan), np.full(prompt.size, np.nan)
    queue = RolloutQueue()
    queue.load("replay", len(order), consumers, chunk if mode == CHUNKS else None, take_cap, groups, prior)
    engines = [_Engine(cost) for _ in range(consumers)]
    seqs = [0] * consumers
    position_of = {row: p for p, row in enumerate(order)}

    def take(index: int, want: int) -> List[int]:
        engine = engines[index]
        progress = [(position_of[r], engine.step - engine.admitted[r]) for _, r in engine.live]
        progress += [(position_of[r], int(resp[r])) for r in engine.finished]
        engine.finished = []
        positions = queue.take("replay", index, seqs[index], want, progress)
        seqs[index] += 1
        return [order[p] for p in positions]

    ready = []  # (time of the engine's next event, engine index)
    for index, engine in enumerate(engines):
        if mode == CHUNKS:
            heapq.heappush(ready, (engine.clock, index))
            continue
        engine.admit(take(index, cap), prompt, resp, start)
        if engine.live:
            heapq.heappush(ready, (_next_cost(engine), index))
    while ready:
        _, index = heapq.heappop(ready)
        engine = engines[index]
        if mode == CHUNKS:  # the chunk's rows whatever is asked for
            rows = take(index, chunk)
            if rows:
                engine.run_chunk(rows, prompt, resp, start, finish)
                heapq.heappush(ready, (engine.clock, index))
            continue
        engine.advance(finish)  # a row finished: a slot is free
        if queue.left:
            engine.admit(take(index, cap - len(engine.live)), prompt, resp, start)
        if engine.live:
            heapq.heappush(ready, (engine.clock + _next_cost(engine), index))
    return Replay(np.array([e.clock for e in engines]), [e.rows for e in engines], start, finish)


def _positive_count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"simulate: {name} must be a positive int, got {value!r}")


def _next_cost(engine: _Engine) -> float:
    """Seconds until ``engine``'s next finishing step (the key that orders engines by their next event)."""
    return engine.cost.of(engine.live[0][0] - engine.step, len(engine.live), engine.prefill)
