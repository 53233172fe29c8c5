"""Text verifiers run in worker processes, each response under a time limit.

A verifier is ``"module:function"`` taking ``(response_text, label_text)`` and
returning a score or ``(score, outcome)``. A response whose verification runs
past ``timeout`` seconds, or raises, or whose process dies, scores 0 and is
counted; the step never waits longer than the limits allow.

The per-response timer covers the verifier call only: each worker process
imports the verifier modules and calls their ``warm_up()`` (when they define
one) in the pool initializer, before any response is timed, and the pool
waits for its workers to be ready (``startup_timeout``) before scoring.
"""
import importlib
import math
import os
import signal
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Dict, List, Sequence, Tuple


class _Timeout(BaseException):
    """Raised by the timer. Not an Exception, so a library's ``except Exception`` cannot swallow it."""


_STATE = {"fired": False}
_RESOLVED: Dict[str, object] = {}


def resolve(path: str):
    """The function named by ``module:function`` (ValueError naming it when absent)."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"verifier {path!r} cannot be imported: {err}") from err


def _on_alarm(signum, frame):
    _STATE["fired"] = True
    raise _Timeout()


def _function(path: str):
    if path not in _RESOLVED:
        _RESOLVED[path] = resolve(path)
    return _RESOLVED[path]


def _init_worker(paths: Tuple[str, ...]) -> None:
    """Pool initializer: import each verifier and warm its module up, untimed."""
    signal.signal(signal.SIGALRM, _on_alarm)
    modules = []
    for path in paths:
        _function(path)
        if path.partition(":")[0] not in modules:
            modules.append(path.partition(":")[0])
    for module in modules:
        warm = getattr(importlib.import_module(module), "warm_up", None)
        if callable(warm):
            warm()


def _ready() -> int:
    return os.getpid()


def _run_one(path: str, response: str, label: str, timeout: float) -> Tuple[float, str]:
    """In a worker process: the verifier under an interval timer started just before the call."""
    fn = _function(path)  # a path not warmed by the initializer is imported here, untimed
    signal.signal(signal.SIGALRM, _on_alarm)
    _STATE["fired"] = False
    try:
        try:
            # after the first alarm it repeats every 0.2 s, so a verifier that swallows one cannot run on
            signal.setitimer(signal.ITIMER_REAL, timeout, 0.2)
            out = fn(response, label)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _Timeout:
        return 0.0, "timeout"
    except Exception as err:  # a crashing verification scores 0
        text = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        return (0.0, "timeout") if _STATE["fired"] else (0.0, f"error: {text}")
    if _STATE["fired"]:  # the timer fired and the verifier caught it anyway: its answer does not count
        return 0.0, "timeout"
    score, outcome = out if isinstance(out, tuple) and len(out) == 2 else (out, "ok")
    try:
        return float(score), str(outcome)
    except (TypeError, ValueError):  # the verifier's answer is no number: it scores 0, and says what it gave
        return 0.0, f"error: returned {type(out).__name__} {repr(out)[:80]}, not a score or (score, outcome)"


class VerifierPool:
    """``processes`` spawned workers scoring with ``timeout`` seconds per response.

    ``warm``: verifier paths each worker imports (and warms up) before it is
    timed. ``startup_timeout``: seconds to wait for the workers to be ready,
    then a RuntimeError."""

    def __init__(self, processes: int = 1, timeout: float = 30.0, warm: Sequence[str] = (),
                 startup_timeout: float = 600.0):
        if processes < 1 or timeout <= 0:
            raise ValueError(f"verifier_parallel must be >= 1 and verifier_timeout > 0, got {processes}, {timeout}")
        self.processes, self.timeout = int(processes), float(timeout)
        self.warm, self.startup_timeout = tuple(warm), float(startup_timeout)
        self._pool = None
        self.first_error = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            pool = ProcessPoolExecutor(self.processes, mp_context=get_context("spawn"),
                                       initializer=_init_worker, initargs=(self.warm,))
            ready = [pool.submit(_ready) for _ in range(self.processes)]
            done, _ = wait(ready, timeout=self.startup_timeout)
            failed = [f for f in done if f.exception() is not None]
            if len(done) < len(ready) or failed:
                self._pool = pool
                self.close(kill=True)
                why = (f"did not start within {self.startup_timeout:.0f} s" if len(done) < len(ready)
                       else f"failed to start: {failed[0].exception()!r}")
                raise RuntimeError(f"verifier processes ({self.processes}, warming {list(self.warm)}) {why}")
            self._pool = pool
        return self._pool

    def score(self, path: str, responses: Sequence[str], labels: Sequence[str]) -> Tuple[List[float], Dict[str, int]]:
        """Scores in order and how many responses ended in each outcome."""
        pool = self._executor()
        futures = [pool.submit(_run_one, path, r, l, self.timeout) for r, l in zip(responses, labels)]
        # each response has its own timer; this generous bound only catches work that never returns to Python
        rounds = math.ceil(len(futures) / self.processes) if futures else 0
        done, _ = wait(futures, timeout=(self.timeout + 1.0) * rounds + 120.0)
        scores, outcomes = [], Counter()
        self.first_error = None  # the first row's error of this call, as the verifier raised it
        for future in futures:
            if future in done and future.exception() is None:
                score, outcome = future.result()
            elif future not in done:
                score, outcome = 0.0, "timeout"
            else:  # the worker process died, or the task failed outside the verifier's call
                err = future.exception()
                died = isinstance(err, BrokenProcessPool)
                score, outcome = 0.0, "error: worker died" if died else f"error: {type(err).__name__}: {err}"[:200]
            scores.append(score)
            if outcome.startswith("error") and self.first_error is None:
                self.first_error = outcome[len("error: "):] or "error"
            outcomes["error" if outcome.startswith("error") else outcome] += 1
        if len(done) < len(futures) or any(f.exception() is not None for f in done):
            self.close(kill=True)  # stuck or broken workers: a fresh pool next time
        return scores, dict(outcomes)

    def close(self, kill: bool = False):
        if self._pool is None:
            return
        if kill:
            for process in list(getattr(self._pool, "_processes", {}).values()):
                try:
                    os.kill(process.pid, signal.SIGKILL)
                except (ProcessLookupError, AttributeError):
                    pass
        self._pool.shutdown(wait=not kill, cancel_futures=True)
        self._pool = None
