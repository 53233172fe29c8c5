"""Text verifiers run in worker processes, each response under a time limit.

A verifier is ``"module:function"`` taking ``(response_text, label_text)`` and
returning a score or ``(score, outcome)``. A response whose verification runs
past ``timeout`` seconds, or raises, or whose process dies, scores 0 and is
counted; the step never waits longer than the limits allow.
"""
import importlib
import math
import os
import signal
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Dict, List, Sequence, Tuple


class _Timeout(Exception):
    pass


def resolve(path: str):
    """The function named by ``module:function`` (ValueError naming it when absent)."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"verifier {path!r} cannot be imported: {err}") from err


def _raise_timeout(signum, frame):
    raise _Timeout()


def _run_one(path: str, response: str, label: str, timeout: float) -> Tuple[float, str]:
    """In a worker process: the verifier under an interval timer."""
    signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        out = resolve(path)(response, label)
    except _Timeout:
        return 0.0, "timeout"
    except Exception as err:  # a crashing verification scores 0
        return 0.0, f"error: {type(err).__name__}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    score, outcome = out if isinstance(out, tuple) else (out, "ok")
    return float(score), str(outcome)


class VerifierPool:
    def __init__(self, processes: int = 1, timeout: float = 30.0):
        if processes < 1 or timeout <= 0:
            raise ValueError(f"verifier_parallel must be >= 1 and verifier_timeout > 0, got {processes}, {timeout}")
        self.processes, self.timeout = int(processes), float(timeout)
        self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.processes, mp_context=get_context("spawn"))
        return self._pool

    def score(self, path: str, responses: Sequence[str], labels: Sequence[str]) -> Tuple[List[float], Dict[str, int]]:
        """Scores in order and how many responses ended in each outcome."""
        pool = self._executor()
        futures = [pool.submit(_run_one, path, r, l, self.timeout) for r, l in zip(responses, labels)]
        # each response has its own timer; this bound only catches work that never returns to Python
        rounds = math.ceil(len(futures) / self.processes) if futures else 0
        done, _ = wait(futures, timeout=self.timeout * rounds + 30.0)
        scores, outcomes = [], Counter()
        for future in futures:
            if future in done and future.exception() is None:
                score, outcome = future.result()
            else:
                score, outcome = 0.0, "timeout" if future not in done else "error: worker died"
            scores.append(score)
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
