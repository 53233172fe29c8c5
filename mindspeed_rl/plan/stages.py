"""The stage table: what one iteration runs, in order.

The run plan iterates this table: a row runs when its ``when`` holds for the
run's ``Features``, and its DP share sizes come from its ``dispatch_key`` and
``share`` (plan/run_plan.py). A ``dp`` stage runs on the ranks of its
``role``'s worker group, each DP rank on its own shares of the round; a
``driver`` stage runs in the driver on the whole round (one fetch in row
order, one put). Adding a stage is one row here and one function registered
under the row's ``method`` (driver: trainer/driver_stages.py) or one method
on the role's worker (dp).

``phase`` 'rollout' stages make a batch of experience from prompts; with
dynamic sampling (DAPO) they run once per rollout batch until the train
batch is full, then the 'train' stages run once on the kept rows.
"""
from dataclasses import dataclass
from typing import Callable, Tuple

# partial rollout: a row's new tokens this pass; with multi-turn, a carried conversation's state into a pass and out
from mindspeed_rl.models.rollout.base import CARRIED_TURN, ROLLOUT_BUDGET, TURN_STATE

SEQ_COLUMNS = ("prompts", "responses", "prompt_length", "response_length")
LENGTH_COST = ("prompt_length", "response_length")
# the rollout engine's log-prob of each sampled token (vLLM), an extra rollout output read by the train stage
ROLLOUT_LOG_PROBS = "rollout_log_probs"
# rollout correction (driver): each token's importance weight and whether it stays in the loss
IS_WEIGHTS = "rollout_is_weights"
RESPONSE_MASK = "response_mask"
# multi-turn: 1 on the tokens the model made (they train), 0 on tool answers; the tool rounds of each row
LOSS_MASK = "loss_mask"
TOOL_CALLS = "tool_call_num"
# the filter metric (DAPO) is an extra output of the reward stage when dynamic sampling is on
FILTER_METRIC = "metric_for_dapo"


@dataclass(frozen=True)
class Features:
    """What a run does, decided once from the configs (run_plan.features); rows' ``when`` read it."""
    dynamic_sampling: bool = False  # DAPO filter_groups_enable
    kl_in_loss: bool = True         # the actor loss has a KL term against the reference
    kl_in_reward: bool = False      # PPO use_kl_in_reward: the KL is taken from the rewards instead
    on_policy: bool = False         # one optimizer step over the round, one epoch: no separate old log-probs
    critic: bool = False            # PPO: a critic worker group (the estimator reads its values)
    estimator: str = "group_norm"   # rl_config.adv_estimator (its registered name)
    rollout_log_probs: bool = False  # the rollout engine returns its log-probs
    rollout_correction: bool = False  # IS weights / rejection between old and rollout log-probs (driver stage)
    bypass: bool = False            # rollout correction's bypass mode: the engine's log-probs are the old ones
    partial_rollout: bool = False   # partial_rollout_max_split > 1: rows carried between passes
    multi_turn: bool = False        # multi_turn_enable: conversations with tools (tool tokens masked out)

    @property
    def carried_turns(self) -> bool:
        """Conversations continued over partial rollout's passes."""
        return self.partial_rollout and self.multi_turn

    @property
    def uses_reference(self) -> bool:
        return self.kl_in_loss or self.kl_in_reward

    def has(self, flag: str) -> bool:
        return bool(getattr(self, flag))


# ``when`` of the rows: module-level functions, so a run plan pickles to the workers
def _always(_: Features) -> bool:
    return True


def _outcome_estimator(f: Features) -> bool:
    return not f.critic


def _dynamic_sampling(f: Features) -> bool:
    return f.dynamic_sampling


def _uses_reference(f: Features) -> bool:
    return f.uses_reference


def _old_log_probs(f: Features) -> bool:
    if f.kl_in_reward:
        return True  # the KL in the rewards is taken before the update
    if f.bypass:
        return False  # the engine's log-probs are the old ones
    return not f.on_policy or f.rollout_correction  # the correction compares them with the engine's


def _rollout_correction(f: Features) -> bool:
    return f.rollout_correction


def _critic(f: Features) -> bool:
    return f.critic


def _kl_in_reward(f: Features) -> bool:
    return f.kl_in_reward


@dataclass(frozen=True)
class Stage:
    name: str                   # dock consumer, metrics key (``timing/<name>``, ``dp_balance/<name>``)
    kind: str                   # 'dp' (worker ranks) or 'driver'
    role: str                   # worker group that computes it: 'actor', 'ref', 'critic' or 'driver'
    method: str                 # worker method (dp) or registered driver function (driver)
    inputs: Tuple[str, ...]     # columns read
    outputs: Tuple[str, ...]    # columns written
    cost_columns: Tuple[str, ...] = LENGTH_COST  # row workload for balance plans
    micro_batch_key: str = ""   # config key of the micro-batch size (dp stages that cut micro-batches)
    dispatch_key: str = ""      # rl_config key of rows per share (update stages: upstream's fetch size, checked)
    balanceable: bool = False   # shares may be balanced by workload
    phase: str = "train"        # 'rollout': repeated per rollout batch under dynamic sampling
    when: Callable[[Features], bool] = _always  # whether a run has this stage
    optional_inputs: Tuple[str, ...] = ()  # also read when an earlier stage of the run writes them
    extra_outputs: Tuple[Tuple[str, str], ...] = ()  # (column, Features flag): written when the flag is on
    extra_inputs: Tuple[Tuple[str, str], ...] = ()   # (column, Features flag): read when the flag is on
    share: str = "round"        # dp rows per share by default: 'round' (the rank's rows) or 'mini' (a mini-batch)
    queue_method: str = ""      # worker method that serves the stage from a queue of the round's rows ('': planned)

    @property
    def is_dp(self) -> bool:
        return self.kind == "dp"

    def outputs_for(self, features: Features) -> Tuple[str, ...]:
        return self.outputs + tuple(c for c, flag in self.extra_outputs if features.has(flag))

    def inputs_for(self, features: Features) -> Tuple[str, ...]:
        return self.inputs + tuple(c for c, flag in self.extra_inputs if features.has(flag))


# rows come from one queue of the round that every engine draws from (rl_config.rollout_balance 'static': fixed shares)
ROLLOUT = Stage("actor_rollout", "dp", "actor", "generate_sequences", ("prompts",),
                ("responses", "response_length"), cost_columns=("prompt_length",),
                dispatch_key="actor_rollout_dispatch_size", phase="rollout",
                extra_outputs=((ROLLOUT_LOG_PROBS, "rollout_log_probs"), (LOSS_MASK, "multi_turn"),
                               (TOOL_CALLS, "multi_turn"), (TURN_STATE, "carried_turns")),
                queue_method="serve_sequences",
                # multi-turn: each row's label is its tools' ground_truth (verl's and upstream's create keyword)
                extra_inputs=((ROLLOUT_BUDGET, "partial_rollout"), ("labels", "multi_turn"),
                              (CARRIED_TURN, "carried_turns")))
REWARD = Stage("rule_reward", "driver", "driver", "compute_rewards",
               ("responses", "labels", "prompt_length", "response_length"), ("rm_scores",), phase="rollout",
               extra_outputs=((FILTER_METRIC, "dynamic_sampling"),), extra_inputs=((TOOL_CALLS, "multi_turn"),))
# GRPO/DAPO and every estimator without a critic: per-token advantages from the scores (before the filter,
# which keeps them with their rows)
GROUP_ADV = Stage("compute_advantage", "driver", "driver", "compute_advantage", ("rm_scores", "response_length"),
                  ("advantages",), phase="rollout", when=_outcome_estimator)
# DAPO dynamic sampling: drop groups whose filter metric is all equal, keep the rest for the train batch
FILTER = Stage("dynamic_sampling", "driver", "driver", "filter_groups", (FILTER_METRIC,), (), phase="rollout",
               when=_dynamic_sampling)
REF = Stage("ref_log_prob", "dp", "ref", "compute_ref_log_prob", SEQ_COLUMNS, ("ref_log_prob",),
            micro_batch_key="ref_forward_micro_batch_size", dispatch_key="ref_dispatch_size", balanceable=True,
            when=_uses_reference)
OLD = Stage("actor_log_prob", "dp", "actor", "compute_log_prob", SEQ_COLUMNS, ("old_log_prob",),
            micro_batch_key="actor_forward_micro_batch_size", dispatch_key="actor_logprob_dispatch_size",
            balanceable=True, when=_old_log_probs)
VALUES = Stage("critic_compute_values", "dp", "critic", "compute_values", SEQ_COLUMNS, ("values",),
               micro_batch_key="micro_batch_size", dispatch_key="critic_value_dispatch_size", balanceable=True,
               when=_critic)
# PPO use_kl_in_reward: per-token rewards = the score on the last token - kl_coef * KL(old || ref)
KL_REWARD = Stage("compute_kl", "driver", "driver", "compute_kl_rewards",
                  ("rm_scores", "response_length", "old_log_prob", "ref_log_prob"), ("token_level_rewards",),
                  when=_kl_in_reward, extra_inputs=((LOSS_MASK, "multi_turn"),))
# PPO: the estimator over the critic's values (GAE); per-token advantages and returns
GAE_ADV = Stage("compute_advantage", "driver", "driver", "compute_advantage", ("rm_scores", "response_length", "values"),
                ("advantages", "returns"), when=_critic,
                optional_inputs=("token_level_rewards",), extra_inputs=((LOSS_MASK, "multi_turn"),))
CRITIC_TRAIN = Stage("critic_train", "dp", "critic", "update", SEQ_COLUMNS + ("values", "returns"), (),
                     micro_batch_key="micro_batch_size", dispatch_key="critic_update_dispatch_size", balanceable=True,
                     share="mini",
                     when=_critic, extra_inputs=((LOSS_MASK, "multi_turn"),))
# rollout correction: importance weights and rejection between the trainer's old log-probs and the engine's
ROLLOUT_CORR = Stage("rollout_correction", "driver", "driver", "compute_rollout_correction",
                     ("old_log_prob", ROLLOUT_LOG_PROBS, "response_length"), (IS_WEIGHTS, RESPONSE_MASK),
                     when=_rollout_correction, extra_inputs=((LOSS_MASK, "multi_turn"),))
TRAIN = Stage("actor_train", "dp", "actor", "update", SEQ_COLUMNS + ("advantages",), (),
              micro_batch_key="micro_batch_size", dispatch_key="actor_update_dispatch_size", balanceable=True,
              share="mini",
              optional_inputs=("old_log_prob", "ref_log_prob", ROLLOUT_LOG_PROBS, IS_WEIGHTS, RESPONSE_MASK,
                               LOSS_MASK))

# in the order an iteration runs them
STAGES: Tuple[Stage, ...] = (ROLLOUT, REWARD, GROUP_ADV, FILTER, REF, OLD, ROLLOUT_CORR, VALUES, KL_REWARD,
                             GAE_ADV, CRITIC_TRAIN, TRAIN)
BALANCED_STAGES = tuple(dict.fromkeys(s.name for s in STAGES if s.balanceable))
