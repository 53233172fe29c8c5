"""Transfer dock: the store between GRPO stages.

Rows are samples (``prompts_num * n_samples_per_prompt`` of them, a GRPO
group's n samples in consecutive rows); columns are experience fields.
Producers put rows; each consumer takes rows it has not consumed yet. With
``use_batch_seqlen_balance`` the first request of a round partitions the whole
ready pool into equal-workload shares (see ``balance_plan``) and later requests
are served the remaining shares.
"""
import threading
import time
from typing import Dict, List, Optional, Sequence, Union

import ray
import torch
from torch import Tensor

from mindspeed_rl.trainer.utils.balance_plan import BalancePlanner
from mindspeed_rl.trainer.utils.columnar import ColumnBatch, ColumnStore, Packed, narrow, pack
from mindspeed_rl.trainer.utils.experience_packing import LENGTH_COLUMNS, trans_input_to_experience
from mindspeed_rl.utils.metrics import Metric

DEFAULT_COLUMNS = [
    "prompts", "prompt_length", "responses", "response_length", "attention_mask", "labels",
    "input_ids", "input_ids_length", "actor_rollout", "rm_scores", "token_level_rewards",
    "old_log_prob", "ref_log_prob", "advantages", "returns",
]
DEFAULT_CONSUMERS = [
    "trainer", "actor_rollout", "actor_log_prob", "ref_log_prob", "actor_train",
    "compute_advantage", "rule_reward", "reward_scores", "grpo_metrics",
]


class TransferDock:
    """Column store with per-cell readiness and a bounded wait for data."""

    def __init__(self, prompts_num: int, n_samples_per_prompt: int,
                 experience_columns: Optional[List[str]], timeout: Optional[float] = None,
                 timeout_interval: Optional[float] = None) -> None:
        for name, value in (("prompts_num", prompts_num), ("n_samples_per_prompt", n_samples_per_prompt)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"TransferDock: {name} must be a positive int, got {value!r}")
        self.prompts_num = prompts_num
        self.n_samples_per_prompt = n_samples_per_prompt
        self.max_len = prompts_num * n_samples_per_prompt
        self.experience_columns = list(experience_columns or [])
        self.timeout = float(timeout) if timeout is not None else 300.0
        self.timeout_interval = float(timeout_interval) if timeout_interval is not None else 0.05
        if self.timeout <= 0 or self.timeout_interval <= 0:
            raise ValueError("TransferDock: timeout and timeout_interval must be positive")
        self._data_lock = threading.RLock()
        self._clear_experience_data_and_status()
        # LENGTH_COLUMNS are also kept as one int64 tensor each, for vectorised sums

    # ------------------------------------------------------------ validation

    def _check_columns(self, columns: Sequence[str], action: str):
        if not columns:
            raise ValueError(f"{action}: no experience columns given")
        unknown = [c for c in columns if c not in self.experience_columns]
        if unknown:
            raise ValueError(f"{action}: unknown columns {unknown}; the dock has {self.experience_columns}")

    def _check_indexes(self, indexes, action: str) -> Tensor:
        if indexes is None or len(indexes) == 0:
            raise ValueError(f"{action}: indexes must be a non-empty list of rows")
        rows = torch.as_tensor(list(indexes), dtype=torch.int64)
        if rows.dim() != 1:
            raise ValueError(f"{action}: indexes must be a flat list of row numbers")
        bad = rows[(rows < 0) | (rows >= self.max_len)]
        if bad.numel():
            raise ValueError(f"{action}: row {int(bad[0])} is outside the dock's range [0, {self.max_len})")
        if torch.unique(rows).numel() != rows.numel():
            raise ValueError(f"{action}: indexes contain duplicate rows")
        return rows

    # ------------------------------------------------------------ storage

    def _put(self, experience_columns: List[str], experience: List[List[Tensor]], indexes: List[int]):
        """Write rows (one list of per-row tensors per column); every check runs before anything is written."""
        self._check_columns(experience_columns, "put experience")
        if len(experience) != len(experience_columns):
            raise ValueError(f"put experience: {len(experience_columns)} columns but {len(experience)} data lists")
        packed = [pack(c, list(v)) for c, v in zip(experience_columns, experience)]
        self._put_packed(experience_columns, packed, indexes)

    def _put_packed(self, experience_columns: List[str], packed: List[Packed], indexes):
        self._check_columns(experience_columns, "put experience")
        rows = self._check_indexes(indexes, "put experience")
        lengths = {}
        for column, part in zip(experience_columns, packed):
            if part[1].numel() != rows.numel():
                raise ValueError(f"put experience: column '{column}' has {part[1].numel()} rows "
                                 f"but {rows.numel()} indexes were given")
            self.experience_data[column].check(column, part)
            if column in LENGTH_COLUMNS:
                lengths[column] = self._scalar_column(column, part)
        with self._data_lock:
            for column, part in zip(experience_columns, packed):
                self.experience_data[column].put(rows, part)
                if column in lengths:
                    self.experience_lengths[column][rows] = lengths[column]
                self.experience_data_status[column][rows] = 1

    @staticmethod
    def _scalar_column(column: str, part: Packed) -> Tensor:
        flat, lengths, trailing = part
        width = 1 if not trailing else int(torch.tensor(trailing).prod())
        sizes = lengths * width
        if bool((sizes != 1).any()):
            row = int((sizes != 1).nonzero()[0, 0])
            raise ValueError(f"put experience: column '{column}' needs one number per row, "
                             f"row {row} has {int(sizes[row])}")
        return flat.to(torch.int64)

    def _missing(self, columns: Sequence[str], rows: Tensor) -> Dict[str, List[int]]:
        missing = {}
        for column in columns:
            not_ready = rows[self.experience_data_status[column][rows] != 1]
            if not_ready.numel():
                missing[column] = not_ready.tolist()
        return missing

    def _wait_for_data(self, columns: Sequence[str], rows: Tensor, consumer: str = "") -> None:
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

    def _get(self, experience_columns: List[str], indexes: Union[List[int], Tensor], consumer: str = ""):
        """Per column, the list of the rows' tensors (views of one gathered buffer)."""
        batch = self._get_batch(experience_columns, indexes, consumer)
        return [batch[c] for c in experience_columns]

    def _get_batch(self, experience_columns: List[str], indexes: Union[List[int], Tensor],
                   consumer: str = "") -> ColumnBatch:
        rows = indexes if isinstance(indexes, Tensor) else self._check_indexes(indexes, "get experience")
        self._wait_for_data(experience_columns, rows, consumer)
        with self._data_lock:  # views of the stored rows; packed into one buffer per column if pickled
            return ColumnBatch({c: self.experience_data[c].rows(rows) for c in experience_columns})

    def _clear_experience_data_and_status(self, indexes=None):
        with self._data_lock:
            if indexes is None:
                self.experience_data = {c: ColumnStore(self.max_len) for c in self.experience_columns}
                self.experience_data_status = {c: torch.zeros(self.max_len, dtype=torch.int32)
                                               for c in self.experience_columns}
                self.experience_lengths = {c: torch.zeros(self.max_len, dtype=torch.int64)
                                           for c in LENGTH_COLUMNS if c in self.experience_columns}
                return
            rows = self._check_indexes(indexes, "clear experience")
            for column in self.experience_columns:
                self.experience_data_status[column][rows] = 0
                self.experience_data[column].clear_rows(rows)

    def get_experience_data(self):
        return self.experience_data

    def get_experience_status(self):
        return self.experience_data_status

    def get_experience_len(self):
        return self.max_len


class GRPOTransferDock(TransferDock):
    """The GRPO dock: consumers, random or workload-balanced sampling, metrics.

    Used as a Ray actor: ``GRPOTransferDock.remote(prompts_num, n_samples, ...)``
    (many concurrent callers); ``GRPOTransferDock.__ray_actor_class__`` is the
    plain class for in-process use.
    """

    def __init__(self, prompts_num: int, n_samples_per_prompt: int, metrics=None,
                 addition_columns: Optional[List[str]] = None, addition_consumers: Optional[List[str]] = None,
                 timeout: Optional[float] = None, timeout_interval: Optional[float] = None,
                 balance_objective: str = "tokens", workload_model=None, balance_method: str = "auto",
                 seed: int = 1234, run_plan=None) -> None:
        """``run_plan`` (config_cls.RunPlan) binds each stage's shares to DP
        ranks (``get_rank_share``) and sets the balance spec, seed and data
        timeout; the keyword settings are for use without a plan."""
        if run_plan is not None:
            spec = run_plan.balance
            if spec is not None:
                balance_objective, balance_method, workload_model = spec.objective, spec.method, spec.workload
            seed, timeout = run_plan.seed, run_plan.timeouts.data_wait
        self.run_plan = run_plan
        columns = list(DEFAULT_COLUMNS) + [c for c in addition_columns or [] if c not in DEFAULT_COLUMNS]
        self.experience_consumers = list(DEFAULT_CONSUMERS) + [
            c for c in addition_consumers or [] if c not in DEFAULT_CONSUMERS]
        super().__init__(prompts_num, n_samples_per_prompt, columns, timeout, timeout_interval)
        # consumers that can be balanced, and the columns that give their workload
        self.batch_seqlen_balance_mapper = {
            c: ["prompt_length", "response_length"]
            for c in ("ref_log_prob", "actor_log_prob", "reward_scores", "actor_train")
        }
        self.metrics = metrics if metrics is not None else Metric()
        self.consumer_sampling_lock = {c: threading.Lock() for c in self.experience_consumers}
        self.planner = BalancePlanner(objective=balance_objective, workload_model=workload_model,
                                      method=balance_method, seed=seed)
        self.seed = seed
        self.round = 0
        self._reset_consumers()

    def _reset_consumers(self):
        """Start a round: consumer progress, plans and rank shares forgotten;
        random draws of the round are seeded by (seed, round)."""
        self.experience_consumer_status = {c: torch.zeros(self.max_len, dtype=torch.int32)
                                           for c in self.experience_consumers}
        self.planner.reset(self.round)
        self._generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.round)
        self._rank_shares: Dict[str, List[Tensor]] = {}
        self._rank_served: Dict[str, List[int]] = {}

    def _check_consumer(self, consumer: str, action: str):
        if consumer not in self.experience_consumers:
            raise ValueError(f"{action}: unknown consumer '{consumer}'; the dock has {self.experience_consumers}")

    # ------------------------------------------------------------ metrics

    def get_metrics(self):
        return self.metrics

    def update_metrics(self, key="", value=None, cumulate=False):
        self.metrics.update(key, value, cumulate=cumulate)

    def get_balance_history(self):
        """Per-share loads of every balance plan since the last call."""
        return self.planner.pop_history()

    # ------------------------------------------------------------ put

    def put_experience(self, data_dict: Dict[str, Union[Tensor, List[Tensor]]], indexes: List[int] = None):
        """Write ``data_dict`` (column -> rows) at ``indexes``; a ColumnBatch that
        came through Ray is written straight from its per-column buffers."""
        if not indexes:
            raise ValueError("put experience: indexes must be provided")
        packed = getattr(data_dict, "_packed", None)
        if packed is not None:
            self._put_packed(list(packed), [narrow(p) for p in packed.values()], indexes)
            return
        columns, experience = trans_input_to_experience(data_dict)
        self._put(columns, experience, indexes)

    def put_prompts_experience(self, batch: Dict[str, Union[Tensor, List[Tensor]]],
                               dataset_additional_keys: Optional[List[str]] = None):
        """Put each prompt ``n_samples_per_prompt`` times (rows 0, 1, ...),
        with its ``prompt_length`` and any additional dataset columns."""
        if "prompts" not in batch:
            raise ValueError("put prompts: the batch has no 'prompts'")
        prompts = list(batch["prompts"])
        n = self.n_samples_per_prompt
        if not prompts or len(prompts) * n > self.max_len:
            raise ValueError(f"put prompts: {len(prompts)} prompts x {n} samples do not fit "
                             f"the dock's {self.max_len} rows")
        data = {
            "prompts": [p.clone() for p in prompts for _ in range(n)],
            "prompt_length": [torch.tensor([p.numel()]) for p in prompts for _ in range(n)],
        }
        for key in dataset_additional_keys or []:
            if key in batch:
                values = list(batch[key])
                if len(values) != len(prompts):
                    raise ValueError(f"put prompts: '{key}' has {len(values)} rows, prompts have {len(prompts)}")
                data[key] = [v for v in values for _ in range(n)]
        self.put_experience(data, indexes=list(range(len(prompts) * n)))

    # ------------------------------------------------------------ get

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

    def get_rank_share(self, consumer: str, experience_columns: List[str], dp_rank: int):
        """The next share of ``consumer`` for DP rank ``dp_rank``, from the run
        plan: ``(batch, indexes, False)``; ``(None, None, False)`` while the
        round's rows are not all ready; ``(None, None, True)`` once the rank
        has taken all its shares. Share s of the round's plan belongs to rank
        s % dp, so which rank gets which rows never depends on timing."""
        if self.run_plan is None:
            raise ValueError("get_rank_share: this dock was built without a run_plan")
        self._check_consumer(consumer, "get_rank_share")
        if consumer not in self.run_plan.stages:
            raise ValueError(f"get_rank_share: the run plan has no stage '{consumer}'; "
                             f"it has {list(self.run_plan.stages)}")
        self._check_columns(experience_columns, f"get_rank_share for '{consumer}'")
        stage, dp = self.run_plan.stages[consumer], self.run_plan.layout.dp
        if isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or not 0 <= dp_rank < dp:
            raise ValueError(f"get_rank_share for '{consumer}': dp_rank must be an int in [0, {dp}), got {dp_rank!r}")
        with self.consumer_sampling_lock[consumer]:
            served = self._rank_served.setdefault(consumer, [0] * dp)
            if served[dp_rank] >= stage.shares_per_rank:
                return None, None, True
            shares = self._rank_shares.get(consumer) or self._plan_round(consumer, experience_columns, stage)
            if shares is None:
                return None, None, False
            units = shares[served[dp_rank] * dp + dp_rank]
            rows = (units[:, None] * stage.unit + torch.arange(stage.unit)).reshape(-1)
            if bool((self.experience_consumer_status[consumer][rows] != 0).any()):
                raise RuntimeError(f"get_rank_share for '{consumer}': rows of rank {dp_rank}'s share were "
                                   f"taken outside the round's plan")
            self.experience_consumer_status[consumer][rows] = 1
            served[dp_rank] += 1
        return self._get_batch(experience_columns, rows, consumer), rows.tolist(), False

    def _plan_round(self, consumer, columns, stage) -> Optional[List[Tensor]]:
        """Split the whole round into the stage's shares once all its rows are ready."""
        cost_columns = self.batch_seqlen_balance_mapper.get(consumer, ["prompt_length"])
        wanted = list(dict.fromkeys(list(columns) + cost_columns))
        if not all(bool((self.experience_data_status[c] == 1).all()) for c in wanted):
            return None
        units = torch.arange(self.max_len // stage.unit)
        shares = self.planner.make_plan(consumer, units, stage.rows_per_share // stage.unit,
                                        self._unit_lengths(consumer, stage.unit), self.metrics,
                                        balanced=stage.balanced)
        expected = self.run_plan.layout.dp * stage.shares_per_rank
        if len(shares) != expected:
            raise RuntimeError(f"get_rank_share for '{consumer}': the plan has {len(shares)} shares, "
                               f"the run plan expects {expected}")
        self._rank_shares[consumer] = shares
        if self.planner.history:  # for reports: which DP rank each share goes to
            self.planner.history[-1]["ranks"] = [s % self.run_plan.layout.dp for s in range(len(shares))]
        return shares

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
        wanted = list(dict.fromkeys(list(columns) + (self.batch_seqlen_balance_mapper[consumer] if balance else [])))
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
            units = self.planner.next_share(consumer, usable, needed, self._unit_lengths(consumer, unit),
                                            self.metrics, unit=unit)
        else:
            self.planner.drop(consumer)  # rows taken outside the plan make it stale
            units = usable[torch.randperm(usable.numel(), generator=self._generator)[:needed]]
        rows = (units[:, None] * unit + torch.arange(unit)).reshape(-1)
        self.experience_consumer_status[consumer][rows] = 1
        return rows

    def _unit_lengths(self, consumer: str, unit: int):
        """unit ids -> their rows' token counts (units x rows), from the consumer's cost columns."""
        columns = self.batch_seqlen_balance_mapper.get(consumer, ["prompt_length"])

        def lengths(units: Tensor) -> Tensor:
            total = sum(self.experience_lengths[c] for c in columns)
            return total.view(-1, unit)[units]
        return lengths

    # ------------------------------------------------------------ status

    def all_consumed(self, consumer: str) -> bool:
        self._check_consumer(consumer, "all_consumed")
        return bool(self.experience_consumer_status[consumer].sum() == self.max_len)

    def set_round(self, round_index: int):
        """Continue the round count (a resumed run): the next ``clear`` starts round ``round_index + 1``."""
        self.round = int(round_index)
        self._reset_consumers()

    def clear(self):
        """Forget all rows, consumer progress, plans and metrics (next round)."""
        self.round += 1
        self._reset_consumers()
        self.metrics.reset()
        self._clear_experience_data_and_status()

    def get_consumer_status(self):
        return self.experience_consumer_status


GRPOTransferDock = ray.remote(max_concurrency=100)(GRPOTransferDock)
