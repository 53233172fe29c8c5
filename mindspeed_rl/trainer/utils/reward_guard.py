"""Rewards that cannot teach anything: a verifier that failed on every row, and rounds whose
advantages are all zero.

A text verifier that raises or times out scores the row 0. When one (with a non-zero weight)
fails on every row of an iteration, training on those zeros learns nothing: after
``rl_config.max_failed_reward_iterations`` such iterations in a row the run stops with one line
naming the verifier and its first error, before the update (0: never stop; the rows score 0 and
each iteration says so)."""
from typing import Dict, List, Optional, Sequence, Tuple


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
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"rl_config.max_failed_reward_iterations must be an int >= 0, got {limit!r}")
        self.limit = limit
        self.streak: List[Tuple[int, str]] = []  # (iteration, what failed)

    def check(self, iteration: int, reward_list: Sequence) -> None:
        """After the reward stage of ``iteration`` (DAPO: of each rollout batch)."""
        what = failed_everywhere(reward_list)
        if what is None:
            self.streak = []
            return
        if not self.streak or self.streak[-1][0] != iteration:  # refills of one iteration count once
            self.streak.append((iteration, what))
        count, limit = len(self.streak), self.limit
        if limit and count >= limit:
            first_it, first = self.streak[0]
            span = f"iteration {first_it}" if count == 1 else f"{count} iterations in a row ({first_it}-{iteration})"
            raise RewardFailureError(
                f"the rewards failed on every row in {span} (rl_config.max_failed_reward_iterations={limit}): "
                f"{first}; training on reward 0 learns nothing, so the run stops before the update")
        print(f"warning: iteration {iteration}: {what}; every row scores 0"
              + (f" ({count} of {limit} in a row allowed)" if limit else ""), flush=True)

    @staticmethod
    def check_advantages(iteration: int, metrics: Dict[str, float]) -> None:
        """After the advantage stage: one line when every advantage of the round is 0."""
        if metrics.get("advantages/zero_frac") == 1.0:
            print(f"warning: iteration {iteration}: every advantage is 0 (the rewards are equal within every "
                  f"group): its update learns nothing", flush=True)
