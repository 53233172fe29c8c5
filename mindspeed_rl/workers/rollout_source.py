"""A rank's end of the rollout queue: takes through the queue's Ray actor, rows read from the round's batch.

At most one take is in flight; ``poll(block=False)`` looks at it without waiting (between engine steps),
``poll(block=True)`` waits for it, never past the stage deadline."""
import time
from typing import Optional

import ray

from mindspeed_rl.balance.rollout_queue import rows_of


class QueueTimeoutError(TimeoutError):
    """The queue did not answer a take before the stage deadline."""


class RaySource:
    def __init__(self, queue, key, consumer: int, order, inputs, deadline: float, clock=time.monotonic,
                 first=None):
        """``queue``: the RolloutQueue actor; ``key``: its round; ``order``: row ids in queue order;
        ``inputs``: the round's input columns in that order (column -> rows); ``deadline``: ``clock()`` time;
        ``first``: this consumer's first take, answered when the queue was loaded (read without a call)."""
        self.queue, self.key, self.consumer = queue, key, consumer
        self.order, self.inputs, self.deadline, self.clock = order, inputs, deadline, clock
        self.seq, self.drained, self.handoff, self.takes = 0, False, False, 0  # takes: that brought rows
        self._ref: Optional[ray.ObjectRef] = None
        self._first = first

    @property
    def waiting(self) -> bool:
        """A take is in flight."""
        return self._ref is not None

    def request(self, want: int, progress=None, turns=None) -> bool:
        """Ask for at most ``want`` rows (``progress``: a callable giving the (position, tokens) evidence,
        called only when a take goes out; ``turns``: conversations handed back, handoff rounds); nothing while a
        take is in flight, the first take is unread, or once drained. Says whether the take went out."""
        if self._ref is None and self._first is None and not self.drained and (want > 0 or turns):
            self._ref = self.queue.take.remote(self.key, self.consumer, self.seq, max(int(want), 0),
                                               progress() if progress else None, list(turns) if turns else None)
            return True
        return False

    def poll(self, block: bool = False):
        if self._first is not None:  # the first take came with the round
            positions, self._first, self.seq = self._first, None, 1
            return rows_of(positions, self.order, self.inputs, self)
        if self._ref is None:
            if not block or self.drained:
                return None
            self.request(1)
        if not block and not ray.wait([self._ref], timeout=0)[0]:
            return None
        left = self.deadline - self.clock()
        try:
            positions = ray.get(self._ref, timeout=max(left, 0.0))
        except ray.exceptions.GetTimeoutError:
            raise QueueTimeoutError(f"rollout queue: consumer {self.consumer} got no answer to take {self.seq} "
                                    f"of round {self.key} before the stage deadline") from None
        self._ref, self.seq = None, self.seq + 1
        return rows_of(positions, self.order, self.inputs, self)
