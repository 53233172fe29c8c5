"""The fast tier (-m 'not slow') leaves out the end-to-end folder and nothing else."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _collected(*args):
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args,
                          "tests/ut/test_fast_tier.py", "tests/st/test_grpo_learning.py", "patches/tests"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_not_slow_drops_the_end_to_end_tests_only():
    every, fast = _collected(), _collected("-m", "not slow")
    assert any(t.startswith("tests/st/") for t in every)
    assert fast == [t for t in every if not t.startswith("tests/st/")]
    assert any(t.startswith("patches/tests/") for t in fast) and any(t.startswith("tests/ut/") for t in fast)
