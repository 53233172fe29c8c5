"""Verifiers for the timeout and crash tests (importable by the verifier processes)."""
import time


def sleepy(response: str, label: str) -> float:
    if response == "slow":
        time.sleep(60)
    return 1.0


def crashy(response: str, label: str) -> float:
    if response == "crash":
        raise RuntimeError("broken verifier")
    return 1.0
