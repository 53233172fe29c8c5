"""num_workers bounds one tool's runs at once; rate_limit bounds all tools with enable_global_rate_limit."""
import asyncio
import logging

import pytest

from mindspeed_rl.tools import sandbox
from mindspeed_rl.tools.retool import ReTool
from mindspeed_rl.tools.sandbox import SandboxResult
from mindspeed_rl.tools.utils import concurrency
from mindspeed_rl.tools.utils.concurrency import ConcurrencyLimit


class Gauge:
    """A fake sandbox run that counts how many runs are inside at once."""

    def __init__(self):
        self.active = self.most = 0

    async def __call__(self, code, limits, stdin=""):
        self.active += 1
        self.most = max(self.most, self.active)
        await asyncio.sleep(0.02)
        self.active -= 1
        return SandboxResult("", "", 0, "ok", False, 0.02)


@pytest.fixture
def gauge(monkeypatch):
    g = Gauge()
    monkeypatch.setattr(sandbox, "sandbox_problem", lambda: None)
    monkeypatch.setattr(sandbox, "run_python_async", g)
    monkeypatch.setattr(concurrency, "_GLOBAL", {})
    return g


def run_all(tools, per_tool):
    async def go():
        await asyncio.gather(*(t.aexecute("i", {"code": "x = 1"}) for t in tools for _ in range(per_tool)))
    asyncio.run(go())


def test_num_workers_bounds_one_tools_runs(gauge):
    run_all([ReTool({"num_workers": 2, "enable_global_rate_limit": False}, None)], 6)
    assert gauge.most == 2


def test_without_the_global_limit_each_tool_has_its_own(gauge):
    run_all([ReTool({"num_workers": 2, "enable_global_rate_limit": False}, None) for _ in range(2)], 4)
    assert gauge.most == 4


def test_the_global_limit_is_shared_by_the_tools_that_enable_it(gauge):
    tools = [ReTool({"num_workers": 10, "rate_limit": 3}, None) for _ in range(2)]
    run_all(tools, 5)
    assert gauge.most == 3
    assert tools[0]._shared is tools[1]._shared


def test_the_first_rate_limit_wins_and_a_different_one_is_logged(gauge, caplog):
    ReTool({"rate_limit": 3}, None)
    with caplog.at_level(logging.WARNING):
        tool = ReTool({"rate_limit": 5}, None)
    assert tool._shared.size == 3
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == \
        ["rate_limit 5 ignored: the shared tool limit is already 3"]


def test_a_limit_works_in_one_event_loop_after_another():
    limit = ConcurrencyLimit(1)

    async def contend():  # two holders, so the second waits on the loop's semaphore
        async def hold():
            async with limit:
                await asyncio.sleep(0.01)
        await asyncio.gather(hold(), hold())
        return True

    loops = [asyncio.new_event_loop() for _ in range(2)]  # both alive: no semaphore is dropped in between
    try:
        assert [loop.run_until_complete(contend()) for loop in loops] == [True, True]
    finally:
        for loop in loops:
            loop.close()
