"""The deadline of a call covers its create and its execute together; a hanging release does not hold the round;
a create that fails releases nothing; the seconds of a failed or timed-out call are its own wall time."""
import asyncio
from types import SimpleNamespace

from mindspeed_rl.agent.tool_runner import ERROR, OK, TIMEOUT, ToolRunner


class Slow:
    """A tool whose create, execute and release each take the given seconds (or raise)."""

    def __init__(self, create=0.0, execute=0.0, release=0.0, create_fails=False, execute_fails=False):
        self.create, self.execute, self.release = create, execute, release
        self.create_fails, self.execute_fails = create_fails, execute_fails
        self.released = []

    async def acreate(self, instance_id, **kwargs):
        await asyncio.sleep(self.create)
        if self.create_fails:
            raise OSError("no room")
        return "inst"

    async def aexecute(self, instance_id, arguments):
        await asyncio.sleep(self.execute)
        if self.execute_fails:
            raise ValueError("bad")
        return "done"

    async def arelease(self, instance_id):
        self.released.append(instance_id)
        await asyncio.sleep(self.release)


def _one(tool, timeout):
    runner = ToolRunner({"t": tool}, timeout=timeout, max_parallel=1)
    try:
        return runner.submit([SimpleNamespace(name="t", arguments="{}")]).result(timeout=300)[0]
    finally:
        runner.close()


def test_create_and_execute_share_one_deadline():
    # 0.6 s + 0.6 s against a 1 s deadline: each alone fits, together they do not
    out = _one(Slow(create=0.6, execute=0.6), timeout=1.0)
    assert out.status == TIMEOUT and out.ran
    assert out.text == "error: t timed out after 1 s"
    assert 1.0 <= out.seconds < 300.0


def test_a_create_that_hangs_times_out_and_is_not_released():
    tool = Slow(create=600.0)
    out = _one(tool, timeout=0.3)
    assert out.status == TIMEOUT and 0.3 <= out.seconds < 300.0
    assert tool.released == []


def test_a_release_that_hangs_is_cut_and_the_answer_kept():
    tool = Slow(release=600.0)
    out = _one(tool, timeout=3.0)  # room for create and execute on a busy machine; the release is cut at 3 s
    assert (out.status, out.text) == (OK, "done")
    assert tool.released == ["inst"]


def test_a_create_that_fails_releases_nothing_and_a_failed_call_reports_its_time():
    tool = Slow(create_fails=True)
    out = _one(tool, timeout=60.0)
    assert (out.status, out.text) == (ERROR, "error: t failed: OSError: no room")
    assert tool.released == []
    slow_fail = Slow(execute=0.2, execute_fails=True)
    out = _one(slow_fail, timeout=60.0)
    assert out.status == ERROR and out.ran and 0.2 <= out.seconds < 300.0
    assert slow_fail.released == ["inst"]
