"""Verifiers for the timeout, crash and warm-up tests (importable by the verifier processes)."""
import time

_WARM = {"done": False}


def sleepy(response: str, label: str) -> float:
    if response == "slow":
        time.sleep(60)
    return 1.0


def crashy(response: str, label: str) -> float:
    if response == "crash":
        raise RuntimeError("broken verifier")
    return 1.0


def swallowing(response: str, label: str):
    """Hangs inside code that catches Exception, as math-verify's parse does."""
    try:
        if response == "slow":
            time.sleep(60)
    except Exception:
        return 1.0, "fallback"
    return 1.0, "ok"


def swallowing_everything(response: str, label: str):
    """Hangs inside code that catches BaseException and returns a score anyway."""
    try:
        if response == "slow":
            time.sleep(60)
    except BaseException:  # noqa: B036 - the point of this test verifier
        return 1.0, "fallback"
    return 1.0, "ok"


def hang_inside_math_verify(response: str, label: str):
    """math_acc with math-verify's extraction hanging for a response "slow"."""
    import math_verify.parser as parser
    from mindspeed_rl.rewards.math_verifier import math_acc
    if not getattr(parser, "_test_patched", False):
        real = parser.extract_target_from_pred

        def extract(pred, *args, **kwargs):
            if "slow" in pred:
                time.sleep(60)
            return real(pred, *args, **kwargs)
        parser.extract_target_from_pred = extract
        parser._test_patched = True
    return math_acc(response, label)


def warm_up():
    """Stands for a slow first import (the pool calls it before any timing)."""
    time.sleep(1.0)
    _WARM["done"] = True


def needs_warm_up(response: str, label: str) -> float:
    if not _WARM["done"]:
        time.sleep(60)  # a cold process: as if the lazy imports ran inside the timer
    return 1.0


def always_raises(response: str, label: str) -> float:
    """A verifier broken for every row (e.g. labels in a format it cannot read)."""
    raise ValueError(f"label {label!r} is not a number")


def wordy(response: str, label: str):
    """Answers in words, not a number (a verifier written against another interface)."""
    return "correct" if response == "ok" else None


def dying(response: str, label: str) -> float:
    """Ends its worker process for a response "die" (a crash in native code)."""
    if response == "die":
        import os
        os._exit(3)
    return 1.0
