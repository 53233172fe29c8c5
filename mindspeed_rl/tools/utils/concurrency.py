"""How many tool calls run at once: upstream's ``num_workers`` (per tool) and ``rate_limit`` with
``enable_global_rate_limit`` (one limit shared by every tool that enables it). Upstream shares the global limit
through a named Ray actor across workers; here it is shared inside one process (one rollout worker)."""
import asyncio
import contextlib
import logging
import weakref
from typing import Dict, Optional

logger = logging.getLogger(__name__)


class ConcurrencyLimit:
    """At most ``size`` holders at once, in whichever event loop uses it (one semaphore per loop)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_loop: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if loop not in self._by_loop:
            self._by_loop[loop] = asyncio.Semaphore(self.size)
        return self._by_loop[loop]

    async def __aenter__(self):
        await self._semaphore().acquire()
        return self

    async def __aexit__(self, *exc) -> None:
        self._semaphore().release()


_GLOBAL: Dict[str, ConcurrencyLimit] = {}


def global_limit(size: int) -> ConcurrencyLimit:
    """The process's shared limit; the first tool that asks sets its size (as upstream's first actor does)."""
    if "limit" not in _GLOBAL:
        _GLOBAL["limit"] = ConcurrencyLimit(size)
    elif _GLOBAL["limit"].size != size:
        logger.warning("rate_limit %s ignored: the shared tool limit is already %s", size, _GLOBAL["limit"].size)
    return _GLOBAL["limit"]


@contextlib.asynccontextmanager
async def limited(own: ConcurrencyLimit, shared: Optional[ConcurrencyLimit]):
    """Holds ``shared`` (when given) and then ``own`` for the body."""
    async with contextlib.AsyncExitStack() as stack:
        if shared is not None:
            await stack.enter_async_context(shared)
        await stack.enter_async_context(own)
        yield
