"""The rollout queue: one round's rows handed out to the rollout engines as they ask.

Pure bookkeeping (no Ray, no torch.distributed): the launcher hosts one ``RolloutQueue`` in a small Ray actor,
the cost replay (balance/rollout_cost.py) and tests hold one in-process. The round is a list of rows in load
order; a take is a list of positions in that order, so the rows' inputs travel once (every consumer reads its
rows from the round's one batch) and the queue moves only integers.

Two ways to hand rows out:

- ``chunk`` (transformers generate, one batch per take): chunk k is always positions
  ``k * chunk .. (k + 1) * chunk - 1``, whoever takes it, so a chunk's sampling does not depend on timing;
- continuous (vLLM, requests join the running engine between steps): a take is at most ``want`` rows (the
  engine's free slots), a fair share of what is left and ``cap``, chosen longest-expected first:
  first one row of every group that has none out yet (a probe: its length is the evidence for its group),
  then the rows of the groups expected to be longest. A group's expectation is the longest length seen among
  its rows (tokens made so far by a running row, the final length of a finished one, as consumers report with
  their takes) or its ``prior`` (e.g. the prompt's length in an earlier round); unknown groups rank at the
  mean of the known ones. The fair share is ``ceil(left / consumers)``, and for a consumer's first take, while
  ``k`` consumers (it included) have not started, ``ceil(left / k)``, taken as every k-th of the top ``k * n``
  rows: the first wave is dealt round-robin, not the longest rows to the first to ask.

A round may stop early (partial rollout's ``async_engine``; ``StopRule``): consumers report each finished row as
complete or cut (a third progress field), and once ``need`` of the round's groups have every row complete the
queue hands out only the rows that must still run (their last allowed pass); the rest are never served.

Free routing of multi-turn rows (``handoff``): a consumer hands back the conversations whose tool round finished
with its next take (``turns``), and every take hands out such turns before fresh rows: to each consumer at most its
share of the running and ready turns (``ceil((running + ready) / consumers)`` less the rows it runs, as its last
report said), so a conversation's next turn goes to the engine that runs fewest rows, not back to the one that ran
its earlier turns. Such a round ends when every row is reported complete or cut (``Take.left`` counts the rows still
running), not when the fresh rows are out: an idle consumer asks again for turns still to come.

A take is keyed by ``(consumer, seq)``: asking again with the same key returns the same rows. Tensor-parallel
peers that must generate together (a TP-sharded model's generate is a collective) ask as one consumer and so
get the same rows in the same order; a repeated request after a lost reply is answered, not served twice.
"""
import hashlib
import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np


RUNNING, CUT, COMPLETE, WAITING = 0, 1, 2, 3  # a progress report's third field: the row's state (WAITING: on its tool)


class StopRule(NamedTuple):
    """When a round stops handing out rows: once ``need`` groups have every row of theirs in the round complete.
    ``sure[p]``: row p is complete whenever it finishes (its budget reaches its end); ``must[p]``: row p is still
    handed out after the stop."""
    need: int
    sure: Sequence[bool]
    must: Sequence[bool]


class Take(list):
    """The positions of one take, and ``left``: how many rows the queue still held when it was answered (0: the
    round is drained; the taker need not ask again). With ``handoff``: ``turns``, the (position, state) of the
    conversations handed to this taker for their next turn, ``left`` counts the round's rows still running and
    ``fresh`` the rows not yet handed out."""

    def __init__(self, positions, left: int, turns=(), handoff: bool = False, fresh: int = 0):
        super().__init__(positions)
        self.left, self.turns, self.handoff, self.fresh = left, list(turns), handoff, fresh

    def __reduce__(self):
        return Take, (list(self), self.left, self.turns, self.handoff, self.fresh)


def _positive(name: str, value, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"rollout queue: {name} must be a positive int{' or None' if optional else ''}, "
                         f"got {value!r}")


class RolloutQueue:
    def __init__(self):
        self.key = None  # no round yet: every take is refused
        self.left = 0
        self._takes: Dict[Tuple[int, int], List[int]] = {}

    def load(self, key, rows: int, consumers: int, chunk: Optional[int] = None, cap: Optional[int] = None,
             groups: Optional[Sequence[int]] = None, prior: Optional[Sequence[float]] = None,
             first: Optional[int] = None, stop: Optional[StopRule] = None,
             handoff: bool = False) -> Dict[int, "Take"]:
        """Start round ``key`` of ``rows`` rows (positions 0 .. rows-1) for ``consumers`` consumers; the last
        round is forgotten. ``chunk``: fixed chunks of that many rows; else continuous takes of at most ``cap``
        rows, longest expected first: ``groups[p]`` is position p's group (default: one group per row),
        ``prior[p]`` its group's expected length (NaN: unknown). With ``first`` (the engines' free slots at the
        start), every consumer's first take is answered now, in consumer order, and returned (each with the
        rows left after them all): the engines start without asking. ``stop``: the round may end before every
        row is served (``StopRule``). ``handoff``: free routing of multi-turn rows (continuous takes only)."""
        _positive("rows", rows)
        _positive("consumers", consumers)
        _positive("chunk", chunk, optional=True)
        _positive("cap", cap, optional=True)
        _positive("first", first, optional=True)
        groups = np.arange(rows) if groups is None else np.asarray(groups, dtype=np.int64).reshape(-1)
        prior = np.full(rows, np.nan) if prior is None else np.asarray(prior, dtype=np.float64).reshape(-1)
        for name, values in (("groups", groups), ("prior", prior)):
            if values.size != rows:
                raise ValueError(f"rollout queue: {name} has {values.size} entries for {rows} rows")
        if groups.size and groups.min() < 0:
            raise ValueError("rollout queue: group ids must be >= 0")
        if handoff and chunk is not None:
            raise ValueError("rollout queue: handoff (free routing of turns) needs continuous takes, not chunks")
        self.key, self.rows, self.consumers, self.chunk, self.cap = key, rows, consumers, chunk, cap
        self.left = rows
        self._takes, self._next = {}, {}
        # groups renumbered 0 .. G-1 in order of first appearance; each keeps its untaken positions in order
        _, seen_at, inverse = np.unique(groups, return_index=True, return_inverse=True)
        self._group = np.argsort(np.argsort(seen_at))[inverse]
        self._members: List[List[int]] = [[] for _ in range(seen_at.size)]
        for position, g in enumerate(self._group.tolist()):
            self._members[g].append(position)
        self._prior = np.full(seen_at.size, np.nan)
        known = ~np.isnan(prior)
        if known.any():
            self._prior[self._group[known]] = prior[known]
        self._seen = np.full(seen_at.size, np.nan)      # longest length reported for a row of the group
        self._out = np.zeros(seen_at.size, dtype=bool)  # a row of the group was handed out
        self._stop = None
        self.handoff = bool(handoff)
        self._ready: List[tuple] = []                     # (position, state): turns handed back, oldest first
        self._running = np.zeros(consumers, dtype=np.int64)  # rows each consumer runs, by its last report
        self._finished = np.zeros(rows, dtype=bool)          # rows reported complete
        self.open = rows                                   # rows neither complete nor dropped by the stop rule
        if stop is not None:
            sure, must = (np.asarray(v, dtype=bool).reshape(-1) for v in (stop.sure, stop.must))
            if sure.size != rows or must.size != rows:
                raise ValueError(f"rollout queue: the stop rule has {sure.size} / {must.size} entries for {rows} rows")
            self._stop = stop._replace(sure=sure, must=must)
            self._complete = np.zeros(rows, dtype=bool)
            self._group_left = np.bincount(self._group, minlength=seen_at.size)  # rows not complete, per group
            self.stopped = int(stop.need) <= 0
        return self._first_takes(first) if first is not None else {}

    def _first_takes(self, want: int) -> Dict[int, "Take"]:
        takes = {c: self.take(self.key, c, 0, want) for c in range(self.consumers)}
        for take in takes.values():
            take.left = self._left()
        return takes

    def _left(self) -> int:
        return self.open if self.handoff else self.left

    # ------------------------------------------------------------ taking

    def take(self, key, consumer: int, seq: int, want: int,
             progress: Optional[Sequence[Tuple[int, int]]] = None, turns: Optional[Sequence[tuple]] = None) -> "Take":
        """Positions for ``consumer``'s ``seq``-th take of round ``key`` (``want``: the engine's free slots; a
        chunked queue hands whole chunks whatever ``want`` is). ``progress``: (position, tokens) of rows the
        consumer runs or finished, the evidence for their groups. Empty once the queue is drained; ``left`` of
        the answer says how many rows the queue still holds. ``turns``: (position, state) of conversations the
        consumer hands back for their next turn (``handoff`` rounds only)."""
        if self.key is None or key != self.key:
            raise ValueError(f"rollout queue: a take for round {key!r}, but the queue holds "
                             + (f"round {self.key!r}" if self.key is not None else "no round"))
        if isinstance(consumer, bool) or not 0 <= consumer < self.consumers:
            raise ValueError(f"rollout queue: consumer {consumer!r} is outside [0, {self.consumers})")
        memo = self._takes.get((consumer, seq))
        if memo is not None:
            return memo
        if seq != self._next.get(consumer, 0):
            raise ValueError(f"rollout queue: consumer {consumer} asked for take {seq}, expected take "
                             f"{self._next.get(consumer, 0)}")
        if turns and not self.handoff:
            raise ValueError(f"rollout queue: consumer {consumer} handed back {len(turns)} turn(s), but round "
                             f"{key!r} routes turns to the engine that holds them (no handoff)")
        for position, _ in turns or ():
            self._check_position(position)
        self.report(progress, consumer)
        self._ready.extend(tuple(t) for t in turns or ())
        if self._stop is not None and self.stopped:
            self._drop_optional()
        if self.handoff:
            handed = self._hand_turns(consumer, int(want))
            want = int(want) - len(handed)
            if want <= 0 or not self.left:
                take = self._takes[(consumer, seq)] = Take([], self._left(), handed, True, self.left)
                self._next[consumer] = seq + 1
                return take
        if self.chunk is not None:  # the untaken rows in position order (consecutive unless a stop dropped some)
            rows = sorted(p for members in self._members for p in members)[:self.chunk]
        else:
            # a first take shares what is left with the consumers that have not started (this one included)
            sharing = self.consumers - len(self._next) if consumer not in self._next else self.consumers
            n = min(max(int(want), 1), math.ceil(self.left / sharing), self.cap or self.left)
            rows = self._best(sharing * n)[::sharing][:n] if consumer not in self._next else self._best(n)
        self._remove(rows)
        if self.handoff:
            self._running[consumer] += len(rows)
            take = Take(rows, self._left(), handed, True, self.left)
        else:
            take = Take(rows, self.left)
        self._takes[(consumer, seq)] = take
        self._next[consumer] = seq + 1
        return take

    def _check_position(self, position) -> None:
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or not 0 <= position < self.rows:
            raise ValueError(f"rollout queue: a handed-back turn names position {position!r}, outside "
                             f"[0, {self.rows})")

    def _hand_turns(self, consumer: int, want: int) -> List[tuple]:
        """The ready turns for ``consumer``: at most ``want`` and its share, oldest first."""
        if want <= 0 or not self._ready:
            return []
        share = math.ceil((int(self._running.sum()) + len(self._ready)) / self.consumers)
        count = min(want, len(self._ready), max(share - int(self._running[consumer]), 0))
        handed, self._ready = self._ready[:count], self._ready[count:]
        self._running[consumer] += count
        return handed

    def report(self, progress: Optional[Sequence[Tuple[int, int]]], consumer: Optional[int] = None) -> None:
        """Evidence: row ``position`` has made ``tokens`` tokens (so far, or in all); with a third field its state
        (RUNNING, CUT, COMPLETE, WAITING). With ``consumer`` (handoff rounds), its RUNNING rows are its load."""
        if not progress:
            if consumer is not None and self.handoff and progress is not None:
                self._running[consumer] = 0  # an empty report: it runs nothing
            return
        width = len(progress[0])
        data = np.asarray(progress, dtype=np.float64).reshape(-1, width)
        positions = data[:, 0].astype(np.int64)
        if positions.min() < 0 or positions.max() >= self.rows:
            bad = int(positions[(positions < 0) | (positions >= self.rows)][0])
            raise ValueError(f"rollout queue: progress names position {bad}, outside [0, {self.rows})")
        if self.handoff and width > 2:
            state = data[:, 2].astype(np.int64)
            ended = (state == COMPLETE) | (state == CUT)  # a cut row leaves the round too (carried to the next)
            fresh = np.unique(positions[ended & ~self._finished[positions]])
            self._finished[fresh] = True
            self.open -= int(fresh.size)
            if consumer is not None:
                self._running[consumer] = int((state == RUNNING).sum())
        groups = self._group[positions]
        seen = np.where(np.isnan(self._seen), -np.inf, self._seen)
        np.maximum.at(seen, groups, data[:, 1])
        self._seen = np.where(np.isinf(seen), np.nan, seen)
        if self._stop is not None and width > 2:
            state = data[:, 2].astype(np.int64)
            done = (state == COMPLETE) | ((state == CUT) & self._stop.sure[positions])
            fresh = np.unique(positions[done & ~self._complete[positions]])
            self._complete[fresh] = True
            np.subtract.at(self._group_left, self._group[fresh], 1)
            finished = int((self._group_left == 0).sum())
            self.stopped = self.stopped or finished >= self._stop.need

    def _drop_optional(self) -> None:
        """After the stop: every untaken row that need not run leaves the queue (it is never served)."""
        for g, members in enumerate(self._members):
            kept = [p for p in members if self._stop.must[p]]
            self.left -= len(members) - len(kept)
            self.open -= len(members) - len(kept)
            self._members[g] = kept

    def expected(self) -> np.ndarray:
        """Each group's expected length: the longest seen, else its prior, else the mean of the known ones."""
        est = np.fmax(self._seen, self._prior)
        known = ~np.isnan(est)
        return np.where(known, est, est[known].mean() if known.any() else 0.0)

    def _best(self, count: int) -> List[int]:
        """The ``count`` untaken positions to hand out first: a probe of every group with none out (longest
        expected first), then the rest of the groups, longest expected first (ties: load order)."""
        est = self.expected()
        ranked = np.lexsort((np.arange(est.size), -est))
        out: List[int] = []
        for g in ranked[~self._out[ranked]].tolist():
            if len(out) >= count:
                return out
            if self._members[g]:
                out.append(self._members[g][0])
        taken = set(out)
        for g in ranked.tolist():
            for position in self._members[g]:
                if len(out) >= count:
                    return out
                if position not in taken:
                    out.append(position)
        return out

    def _remove(self, rows: List[int]) -> None:
        for position in rows:
            g = int(self._group[position])
            self._members[g].remove(position)
            self._out[g] = True
        self.left -= len(rows)

    def taken(self) -> Dict[int, List[int]]:
        """Each consumer's positions so far, in the order taken."""
        out: Dict[int, List[int]] = {}
        for (consumer, _), rows in sorted(self._takes.items()):
            out.setdefault(consumer, []).extend(rows)
        return out


class Rows(NamedTuple):
    positions: List[int]
    ids: List[int]
    inputs: Dict[str, list]
    turns: List[tuple] = []  # handoff: (position, state) of conversations handed over for their next turn

    def __len__(self) -> int:
        return len(self.ids) + len(self.turns)


def rows_of(positions: Take, order, inputs: Dict[str, list], source) -> Rows:
    """The rows at ``positions`` of the queue order: their ids and their inputs; an empty take, or one after
    which the queue held nothing (``Take.left``), marks ``source`` drained (a handoff round: only the latter;
    ``source.handoff`` says the round routes turns freely). ``source.takes`` counts the answers that brought rows
    or turns (the balance figures: one take per engine is the static split)."""
    source.handoff, source.fresh = positions.handoff, positions.fresh
    if positions or positions.turns:
        source.takes += 1
    if positions.left == 0 or (not positions and not positions.handoff):
        source.drained = True
    return Rows(list(positions), [int(order[p]) for p in positions],
                {c: [v[p] for p in positions] for c, v in inputs.items()}, list(positions.turns))


class LocalSource:
    """A consumer's end of a queue in this process (a worker's is ``workers.rollout_source.RaySource``):
    ``request(want, progress, turns)`` asks for rows (``progress``: a callable giving the (position, tokens)
    evidence, called only when a request goes out; ``turns``: conversations handed back, handoff rounds) and says
    whether it went out, ``poll(block)`` returns the answer's ``Rows`` (None while none is ready, empty once the
    queue is drained)."""

    def __init__(self, queue: RolloutQueue, consumer: int, order, inputs: Dict[str, list], first=None):
        """``first``: this consumer's first take, answered when the queue was loaded (``RolloutQueue.load``)."""
        self.queue, self.consumer, self.order, self.inputs = queue, consumer, order, inputs
        self.seq, self.drained, self.handoff, self.takes = 0, False, False, 0
        self._asked: Optional[tuple] = None
        self._first = first

    @property
    def waiting(self) -> bool:
        """A request is out and not yet read."""
        return self._asked is not None

    def request(self, want: int, progress=None, turns=None) -> bool:
        if self._asked is None and self._first is None and not self.drained and (want > 0 or turns):
            self._asked = (max(int(want), 0), progress() if progress else None, list(turns or ()))
            return True
        return False

    def poll(self, block: bool = False):
        if self._first is not None:  # the first take came with the round
            positions, self._first, self.seq = self._first, None, 1
            return rows_of(positions, self.order, self.inputs, self)
        if self._asked is None:
            if not block or self.drained:
                return None
            self._asked = (1, None, [])
        want, progress, turns = self._asked
        positions = self.queue.take(self.queue.key, self.consumer, self.seq, want, progress, turns or None)
        self.seq, self._asked = self.seq + 1, None
        return rows_of(positions, self.order, self.inputs, self)


class PromptLengths:
    """Each prompt's mean response length in the last round it was rolled out in (keyed by its tokens), the
    queue's prior for the next time the prompt comes (an earlier epoch's lengths, longest first). Holds at
    most ``limit`` prompts (the oldest are forgotten)."""

    def __init__(self, limit: int = 1 << 20):
        self.limit, self.lengths = limit, {}

    @staticmethod
    def key(prompt) -> bytes:
        """The prompt's token ids as int64 bytes (whatever their dtype), hashed."""
        return hashlib.blake2b(np.asarray(prompt).astype(np.int64).tobytes()).digest()

    def expect(self, prompts: Sequence) -> np.ndarray:
        """Expected response length per prompt (NaN: never seen)."""
        return np.array([self.lengths.get(self.key(p), np.nan) for p in prompts], dtype=np.float64)

    def update(self, prompts: Sequence, response_lengths: Sequence[float]) -> None:
        """Record a round: rows with the same prompt are averaged (a GRPO group's samples)."""
        sums: Dict[bytes, list] = {}
        for prompt, length in zip(prompts, response_lengths):
            entry = sums.setdefault(self.key(prompt), [0.0, 0])
            entry[0] += float(length)
            entry[1] += 1
        for key, (total, count) in sums.items():
            self.lengths.pop(key, None)  # re-inserted: the newest last
            self.lengths[key] = total / count
        while len(self.lengths) > self.limit:
            self.lengths.pop(next(iter(self.lengths)))
