"""Rounds that cannot teach anything: a verifier that failed on every row, rounds whose advantages are all
zero, and rollout correction that left no token to train on.

A text verifier that raises or times out scores the row 0. When one (with a non-zero weight)
fails on every row of an iteration, training on those zeros learns nothing: after
``rl_config.max_failed_reward_iterations`` such iterations in a row the run stops with one line
naming the verifier and its first error, before the update (0: never stop; the rows score 0 and
each iteration says so). Rollout correction that rejects (or weighs 0) every token of a round trains on
nothing the same way: ``rl_config.max_all_rejected_iterations`` of them in a row stop the run."""
from typing import Dict, List, Optional, Sequence, Tuple

from mindspeed_rl.models.loss.rollout_correction import TRAINED_FRACTION


def check_limit(key: str, limit) -> int:
    """A streak limit: an int >= 0 (0: never stop); ValueError naming ``rl_config.<key>``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"rl_config.{key} must be an int >= 0, got {limit!r}")
    return limit


class Streak:
    """Iterations in a row in which something held, as (iteration, what); an iteration counts once."""

    def __init__(self, limit: int):
        self.limit = limit
        self.items: List[Tuple[int, str]] = []

    def add(self, iteration: int, what: str) -> bool:
        """Count ``iteration``; True when the streak reached the limit (never with limit 0)."""
        if not self.items or self.items[-1][0] != iteration:
            self.items.append((iteration, what))
        return bool(self.limit) and len(self.items) >= self.limit

    def clear(self) -> None:
        self.items = []

    def span(self, iteration: int) -> str:
        first = self.items[0][0]
        count = len(self.items)
        return f"iteration {first}" if count == 1 else f"{count} iterations in a row ({first}-{iteration})"

    def allowed(self) -> str:
        return f" ({len(self.items)} of {self.limit} in a row allowed)" if self.limit else ""


class RewardFailureError(RuntimeError):
    """Too many iterations in a row in which a verifier failed on every row."""


def failed_everywhere(reward_list: Sequence) -> Optional[str]:
    """The first verifier of the last reward call that failed on every row, in words (None: none)."""
    for reward_fn in reward_list:
        for name, f in (getattr(reward_fn, "last_failures", None) or {}).items():
            failed = f["errors"] + f["timeouts"]
            if f["rows"] and failed >= f["rows"] and f.get("weight") != 0:  # no weight given: it counts
                first = f"; the first error: {f['first_error']}" if f.get("first_error") else ""
                return (f"verifier '{name}' failed on all {f['rows']} rows ({f['errors']} raised, "
                        f"{f['timeouts']} timed out{first})")
    return None


class RewardGuard:
    """Counts iterations in a row whose rewards failed on every row; stops at ``limit`` (0: never)."""

    def __init__(self, limit: int = 1):
        self.limit = check_limit("max_failed_reward_iterations", limit)
        self.streak = Streak(self.limit)

    def check(self, iteration: int, reward_list: Sequence) -> None:
        """After the reward stage of ``iteration`` (DAPO: of each rollout batch)."""
        what = failed_everywhere(reward_list)
        if what is None:
            self.streak.clear()
            return
        if self.streak.add(iteration, what):  # refills of one iteration count once
            raise RewardFailureError(
                f"the rewards failed on every row in {self.streak.span(iteration)} "
                f"(rl_config.max_failed_reward_iterations={self.limit}): {self.streak.items[0][1]}; training on "
                f"reward 0 learns nothing, so the run stops before the update")
        print(f"warning: iteration {iteration}: {what}; every row scores 0{self.streak.allowed()}", flush=True)

    @staticmethod
    def check_advantages(iteration: int, metrics: Dict[str, float]) -> None:
        """After the advantage stage: one line when every advantage of the round is 0."""
        if metrics.get("advantages/zero_frac") == 1.0:
            print(f"warning: iteration {iteration}: every advantage is 0 (the rewards are equal within every "
                  f"group): its update learns nothing", flush=True)


class AllRejectedError(RuntimeError):
    """Too many iterations in a row in which rollout correction left no token to train on."""


def nothing_trained(metrics: Dict[str, float], spec) -> Optional[str]:
    """Why the correction stage's round trains on nothing, in words (None: some token trains): every real token
    rejected, or weighed 0 (IcePop's bounds)."""
    if metrics.get(TRAINED_FRACTION) != 0.0:
        return None
    rejected = metrics.get("rollout_corr/rollout_rs_masked_fraction", 0.0)
    if rejected >= 1:
        how = f"rejected {rejected:.1%} of its tokens"
    elif rejected:
        how = f"rejected {rejected:.1%} of its tokens and weighed the others 0"
    else:
        how = "weighed every token 0"
    return f"rollout correction {how} ({spec.describe()[len('rollout correction: '):]})"


class RejectionGuard:
    """Counts iterations in a row whose rollout correction left no token to train on; stops at ``limit``
    (0: never), before the update."""

    def __init__(self, limit: int = 1):
        self.limit = check_limit("max_all_rejected_iterations", limit)
        self.streak = Streak(self.limit)

    def check(self, iteration: int, metrics: Dict[str, float], spec) -> None:
        """After the correction stage of ``iteration`` (its metrics; ``spec``: the run's CorrectionSpec)."""
        what = nothing_trained(metrics, spec)
        if what is None:
            self.streak.clear()
            return
        if self.streak.add(iteration, what):
            raise AllRejectedError(
                f"{self.streak.items[0][1]} in {self.streak.span(iteration)} "
                f"(rl_config.max_all_rejected_iterations={self.limit}): "
                f"the policy loss, its gradient and the KL would all be 0, so the run stops before the update; "
                f"loosen rl_config.rollout_correction's thresholds")
        print(f"warning: iteration {iteration}: {what}: its update learns nothing{self.streak.allowed()}",
              flush=True)
