"""The reward guard's edges: errors and timeouts add up, a failure without a recorded error, a verifier with no
weight given counts, the default limit, limits that are no int, and warnings flushed at once."""
import sys

import pytest

from mindspeed_rl.trainer.utils.reward_guard import RewardFailureError, RewardGuard, failed_everywhere


class Reward:
    def __init__(self, **failure):
        self.last_failures = {"v": dict({"rows": 2, "errors": 1, "timeouts": 1}, **failure)}


def test_errors_and_timeouts_together_fail_every_row():
    assert failed_everywhere([Reward()]) == "verifier 'v' failed on all 2 rows (1 raised, 1 timed out)"
    assert failed_everywhere([Reward(timeouts=0)]) is None
    assert failed_everywhere([Reward(first_error="")]).endswith("timed out)")  # an empty error adds nothing
    assert failed_everywhere([Reward(weight=0)]) is None and failed_everywhere([Reward(weight=0.5)])


def test_the_default_limit_stops_at_the_first_failed_iteration_and_bad_limits_are_refused():
    assert RewardGuard().limit == 1
    with pytest.raises(RewardFailureError):
        RewardGuard().check(1, [Reward()])
    for limit in (True, 1.5, "1"):
        with pytest.raises(ValueError, match=r"must be an int >= 0, got"):
            RewardGuard(limit)


class Stdout:
    def __init__(self):
        self.text, self.flushed = "", 0

    def write(self, text):
        self.text += text

    def flush(self):
        self.flushed += 1


def test_warnings_are_flushed_at_once(monkeypatch):
    out = Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    RewardGuard(0).check(3, [Reward()])
    assert "warning: iteration 3" in out.text and out.flushed == 1
    RewardGuard.check_advantages(4, {"advantages/zero_frac": 1.0})
    assert "warning: iteration 4" in out.text and out.flushed == 2
