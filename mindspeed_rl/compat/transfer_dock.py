"""Upstream's transfer dock: the pull API that ranks call themselves.

``TransferDock`` (upstream's base) is the driver's column storage whose reads
wait for their data: ranks ask for rows other ranks are still computing, so a
read polls every ``timeout_interval`` until each cell is ready or ``timeout``
passes, and reads, writes and clears hold one lock (the actor serves calls
concurrently).

``PullDock`` adds upstream's consumers: a consumer asks for
``experience_count`` rows it has not consumed yet (``get_experience``); with
``use_batch_seqlen_balance`` the first request partitions the ready pool into
equal-workload shares and later requests of the same shape are served the
remaining ones (``BalancePlanner.next_share``). ``GRPOTransferDock`` is
``PullDock`` as upstream's Ray actor class: ``GRPOTransferDock.remote(...)``.

Our trainer uses none of this: its ``DriverDock`` pushes each DP rank its rows.
"""
import threading
import time
from typing import List, Optional, Sequence

import ray
import torch
from torch import Tensor

from mindspeed_rl.data.columnar import ColumnBatch
from mindspeed_rl.data.driver_dock import DriverDock, group_rows

# upstream's columns of the GRPO dock (a run plan adds its stages' outputs)
DEFAULT_COLUMNS = [
    "prompts", "prompt_length", "responses", "response_length", "attention_mask", "labels",
    "input_ids", "input_ids_length", "actor_rollout", "rm_scores", "token_level_rewards",
    "old_log_prob", "ref_log_prob", "advantages", "returns",
]
# upstream's consumers of the GRPO dock
DEFAULT_CONSUMERS = [
    "trainer", "actor_rollout", "actor_log_prob", "ref_log_prob", "actor_train",
    "compute_advantage", "rule_reward", "reward_scores", "grpo_metrics",
]
# consumers whose requests can be balanced, and the columns that give their workload
BALANCE_COST_COLUMNS = {c: ["prompt_length", "response_length"]
                        for c in ("ref_log_prob", "actor_log_prob", "reward_scores", "actor_train")}


class TransferDock(DriverDock):
    """Column store with per-cell readiness and a bounded wait for data."""

    def __init__(self, prompts_num: int, n_samples_per_prompt: int, experience_columns: Optional[List[str]],
                 timeout: Optional[float] = None, timeout_interval: Optional[float] = None, **dock) -> None:
        """``dock``: DriverDock's other keywords."""
        self.timeout = float(timeout) if timeout is not None else 300.0
        self.timeout_interval = float(timeout_interval) if timeout_interval is not None else 0.05
        if self.timeout <= 0 or self.timeout_interval <= 0:
            raise ValueError("TransferDock: timeout and timeout_interval must be positive")
        self._data_lock = threading.RLock()
        super().__init__(prompts_num, n_samples_per_prompt, experience_columns=list(experience_columns or []),
                         **dock)

    def _empty(self):
        with self._data_lock:
            super()._empty()

    def _write(self, *args):
        with self._data_lock:
            super()._write(*args)

    def _gather(self, columns, rows: Tensor) -> ColumnBatch:
        with self._data_lock:
            return super()._gather(columns, rows)

    def _wait_for_data(self, columns: Sequence[str], rows: Tensor, consumer: str) -> None:
        """Wait until every cell is ready; raise TimeoutError after ``timeout``."""
        deadline = time.monotonic() + self.timeout
        missing = self._missing(columns, rows)
        while missing:
            if time.monotonic() >= deadline:
                detail = "; ".join(f"'{c}' rows {r[:16]}{' ...' if len(r) > 16 else ''}" for c, r in missing.items())
                raise TimeoutError(f"transfer dock: consumer '{consumer}' waited {self.timeout:g}s "
                                   f"for data that never came: {detail}")
            time.sleep(self.timeout_interval)
            missing = self._missing(columns, rows)

    def _views(self, experience_columns: List[str], rows: Tensor) -> ColumnBatch:
        """Ready rows as views of the stored rows (one buffer per column if pickled)."""
        with self._data_lock:
            return ColumnBatch({c: self.experience_data[c].views(rows) for c in experience_columns})

    def _put(self, experience_columns: List[str], experience: List[List[Tensor]],
             indexes: Optional[List[int]] = None) -> None:
        """Upstream's low-level write: ``experience[c][i]`` is column ``experience_columns[c]``'s value
        at row ``indexes[i]``. Checked whole before anything is written (``put_experience``)."""
        columns = list(experience_columns or [])
        if len(experience) != len(columns):
            raise ValueError(f"put experience: {len(columns)} columns {columns} but {len(experience)} "
                             f"lists of rows were given")
        self.put_experience(dict(zip(columns, (list(rows) for rows in experience))), indexes)

    def _get(self, experience_columns: List[str], indexes: List[int]) -> List[List[Tensor]]:
        """Upstream's low-level read: for each column, the rows ``indexes`` in that order, once every cell is
        ready (waits up to ``timeout``). No rows: one empty list per column."""
        columns = list(experience_columns)
        self._check_columns(columns, "get experience")
        if len(indexes) == 0:
            return [[] for _ in columns]
        rows = self._check_indexes(indexes, "get experience")
        self._wait_for_data(columns, rows, "_get")
        batch = self._views(columns, rows)
        return [list(batch[c]) for c in columns]

    def get_experience_data(self):
        return self.experience_data

    def get_experience_status(self):
        return self.experience_data_status

    def get_experience_len(self):
        return self.max_len


class PullDock(TransferDock):
    """Upstream's GRPO dock as a plain class: consumers pull rows with ``get_experience``.

    ``GRPOTransferDock.remote(prompts_num, n_samples, ...)`` runs it as a Ray actor."""

    def __init__(self, prompts_num: int, n_samples_per_prompt: int, metrics=None,
                 addition_columns: Optional[List[str]] = None, addition_consumers: Optional[List[str]] = None,
                 timeout: Optional[float] = None, timeout_interval: Optional[float] = None,
                 balance_objective: str = "tokens", workload_model=None, balance_method: str = "auto",
                 seed: int = 1234, run_plan=None) -> None:
        """``run_plan`` (config_cls.RunPlan), when given, sets the balance spec, seed and data timeout."""
        if run_plan is not None:
            timeout = run_plan.timeouts.td_timeout
        if ray.is_initialized() and ray.get_runtime_context().get_actor_id():
            torch.set_num_threads(1)  # the dock actor moves small buffers; intra-op threads only add latency
        self.experience_consumers = list(DEFAULT_CONSUMERS) + [
            c for c in addition_consumers or [] if c not in DEFAULT_CONSUMERS]
        self.consumer_sampling_lock = {c: threading.Lock() for c in self.experience_consumers}
        planned = [c for st in run_plan.stages.values() for c in st.outputs] if run_plan is not None else []
        columns = DEFAULT_COLUMNS + list(addition_columns or []) + planned
        super().__init__(prompts_num, n_samples_per_prompt, columns, timeout, timeout_interval, run_plan=run_plan,
                         metrics=metrics, balance_objective=balance_objective, workload_model=workload_model,
                         balance_method=balance_method, seed=seed)

    def _new_round(self):
        """Also: nothing consumed, random draws seeded by (seed, round)."""
        super()._new_round()
        self._generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.round)
        self.batch_seqlen_balance_mapper = {c: list(v) for c, v in BALANCE_COST_COLUMNS.items()}
        self.experience_consumer_status = {c: torch.zeros(self.max_len, dtype=torch.int32)
                                           for c in self.experience_consumers}

    # ------------------------------------------------------------ metrics

    def get_metrics(self):
        return self.metrics

    def update_metrics(self, key="", value=None, cumulate=False):
        """Upstream's ranks record their own timings on the dock."""
        self.metrics.update(key, value, cumulate=cumulate)

    def get_balance_history(self):
        """Per-share loads of every balance plan since the last call."""
        return self.planner.pop_history()

    # ------------------------------------------------------------ consumers

    def _check_consumer(self, consumer: str, action: str):
        if consumer not in self.experience_consumers:
            raise ValueError(f"{action}: unknown consumer '{consumer}'; the dock has {self.experience_consumers}")

    def _unit_lengths(self, columns, unit: int):
        """unit ids -> their rows' token counts (units x rows), summed over ``columns``; a unit is
        ``unit`` consecutive rows (a whole GRPO group with get_n_samples)."""

        def lengths(units: Tensor) -> Tensor:
            total = sum(self.experience_lengths[c] for c in columns)
            return total.view(-1, unit)[units]
        return lengths

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
        return self._views(experience_columns, rows), rows.tolist()  # rows are ready: waited for, or sampled so

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
        cost_columns = self.batch_seqlen_balance_mapper[consumer] if balance else []
        wanted = list(dict.fromkeys(list(columns) + cost_columns))
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
        rows = group_rows(units, unit)
        self.experience_consumer_status[consumer][rows] = 1
        return rows

    def all_consumed(self, consumer: str) -> bool:
        self._check_consumer(consumer, "all_consumed")
        return bool(self.experience_consumer_status[consumer].sum() == self.max_len)

    def get_consumer_status(self):
        return self.experience_consumer_status


# upstream's actor: concurrent calls, so a rank's waiting get_experience never blocks the puts it waits for
GRPOTransferDock = ray.remote(max_concurrency=100)(PullDock)
