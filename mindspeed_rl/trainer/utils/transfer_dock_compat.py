"""Upstream's pull API of the GRPO dock, kept so code ported from upstream runs.

A consumer asks for ``experience_count`` rows it has not consumed yet
(``get_experience``); with ``use_batch_seqlen_balance`` the first request
partitions the ready pool into equal-workload shares and later requests of the
same shape are served the remaining ones (``BalancePlanner.next_share``).
Our own trainer does not use this path: the driver pushes each DP rank its
rows (``GRPOTransferDock.plan_stage`` / ``get_rows``).
"""
import threading
from typing import List, Optional

import torch
from torch import Tensor

# upstream's columns and consumers of the GRPO dock
DEFAULT_COLUMNS = [
    "prompts", "prompt_length", "responses", "response_length", "attention_mask", "labels",
    "input_ids", "input_ids_length", "actor_rollout", "rm_scores", "token_level_rewards",
    "old_log_prob", "ref_log_prob", "advantages", "returns",
]
DEFAULT_CONSUMERS = [
    "trainer", "actor_rollout", "actor_log_prob", "ref_log_prob", "actor_train",
    "compute_advantage", "rule_reward", "reward_scores", "grpo_metrics",
]

# consumers whose requests can be balanced, and the columns that give their workload
BALANCE_COST_COLUMNS = {c: ["prompt_length", "response_length"]
                        for c in ("ref_log_prob", "actor_log_prob", "reward_scores", "actor_train")}


class UpstreamPullMixin:
    """Consumer status and ``get_experience`` over the dock's storage and planner."""

    def _unit_lengths(self, columns, unit: int):
        """unit ids -> their rows' token counts (units x rows), summed over ``columns``; a unit is
        ``unit`` consecutive rows (a whole GRPO group with get_n_samples)."""

        def lengths(units: Tensor) -> Tensor:
            total = sum(self.experience_lengths[c] for c in columns)
            return total.view(-1, unit)[units]
        return lengths

    def _reset_pull_state(self):
        self.batch_seqlen_balance_mapper = {c: list(v) for c, v in BALANCE_COST_COLUMNS.items()}
        self.experience_consumer_status = {c: torch.zeros(self.max_len, dtype=torch.int32)
                                           for c in self.experience_consumers}
        if not hasattr(self, "consumer_sampling_lock"):
            self.consumer_sampling_lock = {c: threading.Lock() for c in self.experience_consumers}

    def _check_consumer(self, consumer: str, action: str):
        if consumer not in self.experience_consumers:
            raise ValueError(f"{action}: unknown consumer '{consumer}'; the dock has {self.experience_consumers}")

    def get_experience(self, consumer: str, experience_columns: List[str], experience_count: int = None,
                       indexes: List[int] = None, get_n_samples: bool = True,
                       use_batch_seqlen_balance: bool = False):
        """Rows for ``consumer``: ``(batch_dict, indexes)`` or ``(None, None)``
        when not enough rows are ready yet.

        ``indexes`` fetches those rows (waiting for them up to ``timeout``);
        otherwise ``experience_count`` unconsumed ready rows are chosen, whole
        GRPO groups when ``get_n_samples``, balanced by workload when
        ``use_batch_seqlen_balance`` and the consumer supports it, else at random.
        """
        self._check_consumer(consumer, "get experience")
        self._check_columns(experience_columns, f"get experience for '{consumer}'")
        if indexes is not None:
            rows = self._check_indexes(indexes, f"get experience for '{consumer}'")
            self._wait_for_data(experience_columns, rows, consumer)  # a timeout leaves state as it was
            with self.consumer_sampling_lock[consumer]:
                self.experience_consumer_status[consumer][rows] = 1
                self.planner.drop(consumer)
        else:
            self._check_count(consumer, experience_count, get_n_samples)
            balance = use_batch_seqlen_balance and consumer in self.batch_seqlen_balance_mapper
            with self.consumer_sampling_lock[consumer]:
                rows = self._sample(consumer, experience_columns, experience_count, get_n_samples, balance)
            if rows is None:
                return None, None
        return self._get_batch(experience_columns, rows, consumer), rows.tolist()

    def _check_count(self, consumer, count, get_n_samples):
        if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
            raise ValueError(f"get experience for '{consumer}': experience_count must be a positive int, got {count!r}")
        if count > self.max_len:
            raise ValueError(f"get experience for '{consumer}': experience_count {count} exceeds "
                             f"the dock's {self.max_len} rows")
        if get_n_samples and count % self.n_samples_per_prompt:
            raise ValueError(f"get experience for '{consumer}': experience_count {count} must be a multiple "
                             f"of n_samples_per_prompt {self.n_samples_per_prompt} when get_n_samples is set")

    def _sample(self, consumer, columns, count, get_n_samples, balance) -> Optional[Tensor]:
        """Choose rows and mark them consumed (caller holds the consumer lock)."""
        unit = self.n_samples_per_prompt if get_n_samples else 1
        needed = count // unit
        cost_columns = self.batch_seqlen_balance_mapper.get(consumer, ["prompt_length"])
        wanted = list(dict.fromkeys(list(columns) + (cost_columns if balance else [])))
        ready = torch.stack([self.experience_data_status[c] == 1 for c in wanted]).all(dim=0)
        fresh = self.experience_consumer_status[consumer] == 0
        ready_u = ready.view(-1, unit).all(dim=1)
        fresh_u = fresh.view(-1, unit).all(dim=1)
        usable = (ready_u & fresh_u).nonzero(as_tuple=True)[0]
        remaining = int(fresh_u.sum())
        # a short final batch is served once every remaining unit is ready
        if usable.numel() < needed and not (0 < usable.numel() == remaining):
            return None
        if balance:
            # every other way of taking this consumer's rows drops its plan, so shares stay unconsumed
            units = self.planner.next_share(consumer, usable, needed, self._unit_lengths(cost_columns, unit),
                                            self.metrics, unit=unit)
        else:
            self.planner.drop(consumer)  # rows taken outside the plan make it stale
            units = usable[torch.randperm(usable.numel(), generator=self._generator)[:needed]]
        rows = (units[:, None] * unit + torch.arange(unit)).reshape(-1)
        self.experience_consumer_status[consumer][rows] = 1
        return rows

    def all_consumed(self, consumer: str) -> bool:
        self._check_consumer(consumer, "all_consumed")
        return bool(self.experience_consumer_status[consumer].sum() == self.max_len)

    def get_consumer_status(self):
        return self.experience_consumer_status
