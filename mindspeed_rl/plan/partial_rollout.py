"""Partial rollout (upstream's ``rl_config.partial_rollout_max_split`` and ``async_engine``), checked into one spec.

With ``partial_rollout_max_split: N > 1`` a row makes at most ``ceil(max_tokens / N)`` new tokens per rollout
pass; a row that neither ended (EOS) nor reached ``max_tokens`` is carried, with its tokens, its rollout log-probs
and the iteration each token was sampled in, and continues first in the next pass. With multi_turn_enable a row's
budget is the whole conversation, ``max_total_response_length`` (model and tool tokens): a pass continues it until it
ends or its pass budget is used, cut inside a turn or right after a tool answer, and its turns are carried too.
The pool holds up to twice ``global_batch_size`` prompts (upstream's dock size); passes run until
``global_batch_size`` prompts have every sample complete, and those train (the oldest first). Every row is complete
within N passes.
``async_engine: true`` (with N > 1) also stops a pass as soon as enough prompts are complete, carrying every
running row, except rows in their last allowed pass (``require_max_age_all_finished``) which run to the end.
"""
import math
from dataclasses import dataclass


MAX_TOKENS_KEY = "generate_config.sampling_config.max_tokens"
CONVERSATION_KEY = "rl_config.max_total_response_length"


@dataclass(frozen=True)
class PartialSpec:
    max_split: int              # N
    max_tokens: int             # a row's whole budget (the value of ``budget_key``)
    train_prompts: int          # prompts (groups) trained per iteration: global_batch_size
    pool_prompts: int           # prompts the pool holds at most
    async_engine: bool = False  # stop a pass once train_prompts prompts are complete
    max_age_finished: bool = True  # rows in their N-th pass always run to the end (require_max_age_all_finished)
    budget_key: str = MAX_TOKENS_KEY  # the key max_tokens comes from (multi-turn: the whole conversation's)

    @property
    def pass_tokens(self) -> int:
        """New tokens a row may make in one pass."""
        return math.ceil(self.max_tokens / self.max_split)

    def describe(self, filtered: bool = False) -> str:
        """The plan's line; ``filtered``: dynamic sampling filters each take of complete prompts."""
        name = self.budget_key.rsplit(".", 1)[1]
        takes = (f"takes of {self.train_prompts} complete prompts go to dynamic sampling's filter" if filtered else
                 f"{self.train_prompts} complete prompts train per iteration")
        return (f"partial rollout: at most {self.pass_tokens} new tokens per row per pass "
                f"({name}={self.max_tokens} / partial_rollout_max_split={self.max_split}); up to "
                f"{self.pool_prompts} prompts in flight, {takes}"
                + ("; a pass stops once they are complete (async_engine)" if self.async_engine else ""))


def partial_spec(rl_config, generate_config, global_batch_size: int, multi_turn=None):
    """The spec, or None when partial rollout is off (N = 1); ValueError naming the key on a bad setting.
    ``multi_turn``: the run's MultiTurnSpec (a row's budget is then its whole conversation)."""
    n = rl_config.partial_rollout_max_split
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"rl_config.partial_rollout_max_split={n!r} must be an int >= 1 (1: off)")
    for key in ("async_engine", "require_max_age_all_finished"):
        if not isinstance(getattr(rl_config, key), bool):
            raise ValueError(f"rl_config.{key}={getattr(rl_config, key)!r} must be true or false")
    if n == 1:
        return None
    if rl_config.rollout_balance == "static":
        raise ValueError("rl_config.rollout_balance must be 'queue' (guarantee_order false) when "
                         "partial_rollout_max_split > 1 (carried rows continue on whichever engine takes them from "
                         "the rollout queue)")
    key = CONVERSATION_KEY if multi_turn is not None else MAX_TOKENS_KEY
    max_tokens = (multi_turn.max_total_response_length if multi_turn is not None
                  else generate_config.sampling_config["max_tokens"])
    if n > max_tokens:
        raise ValueError(f"rl_config.partial_rollout_max_split={n} exceeds {key.replace('generate_config.', '')}="
                         f"{max_tokens}: a pass must make at least one token")
    return PartialSpec(n, int(max_tokens), global_batch_size, 2 * global_batch_size,
                       async_engine=rl_config.async_engine,
                       max_age_finished=rl_config.require_max_age_all_finished, budget_key=key)
