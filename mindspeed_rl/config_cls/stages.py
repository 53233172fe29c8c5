"""The stage table: what one GRPO iteration runs, in order.

Every other module names a stage through this table (``STAGES`` or the
constants below); the run plan picks the stages a run needs and sizes their
shares. A ``dp`` stage runs on the worker ranks, each DP rank on its own
shares of the round; a ``driver`` stage runs in the driver on the whole round
(one fetch in row order, one put).

``phase`` 'rollout' stages make a batch of experience from prompts; with
dynamic sampling (DAPO) they run once per rollout batch until the train
batch is full, then the 'train' stages run once on the kept rows.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

SEQ_COLUMNS = ("prompts", "responses", "prompt_length", "response_length")
LENGTH_COST = ("prompt_length", "response_length")


@dataclass(frozen=True)
class Stage:
    name: str                   # dock consumer, metrics key (``timing/<name>``, ``dp_balance/<name>``)
    kind: str                   # 'dp' (worker ranks) or 'driver'
    role: str                   # engine that computes it: 'actor', 'ref' or 'driver'
    method: str                 # worker method (dp) or trainer method (driver)
    inputs: Tuple[str, ...]     # columns read
    outputs: Tuple[str, ...]    # columns written
    cost_columns: Tuple[str, ...] = LENGTH_COST  # row workload for balance plans
    micro_batch_key: Optional[str] = None        # config key of the micro-batch size
    dispatch_key: Optional[str] = None           # rl_config key of rows per share
    granularity: str = "sample"  # 'sample': rows move alone; 'group': a GRPO group stays together
    balanceable: bool = False    # shares may be balanced by workload
    phase: str = "train"         # 'rollout': repeated per rollout batch under dynamic sampling

    @property
    def is_dp(self) -> bool:
        return self.kind == "dp"


ROLLOUT = Stage("actor_rollout", "dp", "actor", "generate_sequences", ("prompts",),
                ("responses", "response_length"), cost_columns=("prompt_length",),
                dispatch_key="actor_rollout_dispatch_size", phase="rollout")
# the rollout engine's log-prob of each sampled token (vLLM), an extra rollout output read by the train stage
ROLLOUT_LOG_PROBS = "rollout_log_probs"
# the filter metric (DAPO) is a third output of the reward stage when dynamic sampling is on
FILTER_METRIC = "metric_for_dapo"
REWARD = Stage("rule_reward", "driver", "driver", "compute_rewards",
               ("responses", "labels", "prompt_length", "response_length"), ("rm_scores", "advantages"),
               phase="rollout")
# DAPO dynamic sampling: drop groups whose filter metric is all equal, keep the rest for the train batch
FILTER = Stage("dynamic_sampling", "driver", "driver", "filter_groups", (FILTER_METRIC,), (), phase="rollout")
REF = Stage("ref_log_prob", "dp", "ref", "compute_ref_log_prob", SEQ_COLUMNS, ("ref_log_prob",),
            micro_batch_key="ref_forward_micro_batch_size", dispatch_key="ref_dispatch_size", balanceable=True)
OLD = Stage("actor_log_prob", "dp", "actor", "compute_log_prob", SEQ_COLUMNS, ("old_log_prob",),
            micro_batch_key="actor_forward_micro_batch_size", dispatch_key="actor_logprob_dispatch_size",
            balanceable=True)
TRAIN = Stage("actor_train", "dp", "actor", "update", SEQ_COLUMNS + ("advantages",), (),
              micro_batch_key="micro_batch_size", dispatch_key="actor_update_dispatch_size", balanceable=True)

# in the order an iteration runs them
STAGES: Tuple[Stage, ...] = (ROLLOUT, REWARD, FILTER, REF, OLD, TRAIN)
BY_NAME: Dict[str, Stage] = {s.name: s for s in STAGES}
BALANCED_STAGES = tuple(s.name for s in STAGES if s.balanceable)


def stage_named(name: str) -> Stage:
    if name not in BY_NAME:
        raise KeyError(f"no stage '{name}'; the stage table has {list(BY_NAME)}")
    return BY_NAME[name]
