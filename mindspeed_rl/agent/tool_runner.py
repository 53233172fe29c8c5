"""Tool calls run here, beside the engine: an asyncio loop in its own thread. The engine's loop submits a round
(the calls of one turn) and goes on stepping; it reads the answers when the round's future is done. Each call
has a deadline; an error, a timeout or a call that names no tool becomes the call's answer, never an exception in
the engine's loop."""
import asyncio
import json
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

# a call's outcome
OK, ERROR, TIMEOUT, SKIPPED = "ok", "error", "timeout", "skipped"


@dataclass
class CallResult:
    text: str
    status: str       # OK, ERROR, TIMEOUT or SKIPPED
    seconds: float
    ran: bool = False  # the call reached its tool (it may still have failed or timed out)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return f"{type(err).__name__}: {text}" if text != type(err).__name__ else text


def answer_text(result) -> str:
    """A tool's ``execute`` result as text: upstream's ``(text, reward, metrics)``, verl's ``ToolResponse`` (its
    ``text``), or a plain string."""
    if isinstance(result, tuple):
        result = result[0] if result else ""
    text = getattr(result, "text", result)
    if text is None:
        return ""
    return text if isinstance(text, str) else json.dumps(text, ensure_ascii=False) if isinstance(
        text, (dict, list)) else str(text)


class ToolRunner:
    def __init__(self, tools: Dict[str, object], timeout: float, max_parallel: int):
        self.tools, self.timeout, self.max_parallel = dict(tools), float(timeout), int(max_parallel)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tool-runner", daemon=True)
        self._thread.start()

    def submit(self, calls: Sequence, malformed: Sequence[str] = (), create_kwargs: Optional[dict] = None
               ) -> "Future[List[CallResult]]":
        """Run a round: ``calls`` (parsed calls with ``name`` and JSON ``arguments``), the first
        ``max_parallel`` at once, the rest marked skipped (not run, not answered: upstream and verl drop them); ``malformed``: a line per call that could not be
        parsed, answered with it; ``create_kwargs``: what each tool's ``create`` is given (the row's ground_truth)."""
        return asyncio.run_coroutine_threadsafe(self._round(list(calls), list(malformed), create_kwargs or {}),
                                                self.loop)

    async def _round(self, calls, malformed, create_kwargs) -> List[CallResult]:
        run = calls[:self.max_parallel]
        results = list(await asyncio.gather(*(self._call(c, create_kwargs) for c in run)))
        results += [CallResult("", SKIPPED, 0.0) for _ in calls[len(run):]]
        results += [CallResult(f"error: {line}", ERROR, 0.0) for line in malformed]
        return results

    async def _call(self, call, create_kwargs) -> CallResult:
        start = time.monotonic()
        name = getattr(call, "name", None)
        tool = self.tools.get(name)
        if tool is None:
            return CallResult(f"error: there is no tool named {name!r}; tools: {sorted(self.tools)}", ERROR, 0.0)
        try:
            arguments = call.arguments if isinstance(call.arguments, dict) else json.loads(call.arguments or "{}")
        except ValueError as err:
            return CallResult(f"error: the arguments of {name} are not JSON: {_one_line(err)}", ERROR, 0.0)
        if not isinstance(arguments, dict):
            return CallResult(f"error: the arguments of {name} must be a JSON object", ERROR, 0.0)
        instance = None
        try:
            instance = await asyncio.wait_for(tool.acreate(None, **create_kwargs), self.timeout)
            left = max(0.0, self.timeout - (time.monotonic() - start))
            result = await asyncio.wait_for(tool.aexecute(instance, arguments), left)
            return CallResult(answer_text(result), OK, time.monotonic() - start, ran=True)
        except asyncio.TimeoutError:
            return CallResult(f"error: {name} timed out after {self.timeout:g} s", TIMEOUT, time.monotonic() - start,
                              ran=True)
        except Exception as err:  # a tool's failure is the call's answer
            return CallResult(f"error: {name} failed: {_one_line(err)}", ERROR, time.monotonic() - start, ran=True)
        finally:
            if instance is not None:
                try:
                    await asyncio.wait_for(tool.arelease(instance), self.timeout)
                except Exception:  # noqa: BLE001  a release that fails loses nothing of the answer
                    pass

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
        if not self.loop.is_running():
            self.loop.close()
