"""Transfer dock: the store between GRPO stages.

Rows are samples (``prompts_num * n_samples_per_prompt`` of them, a GRPO
group's n samples in consecutive rows); columns are experience fields.

The trainer holds the dock in the driver process (``DriverDock``, verl's
single-controller shape) and runs the stages of the run plan in order. For a
DP stage ``dispatch`` plans the round (balanced shares, share s to DP rank
s % dp) and cuts each rank's rows; the driver sends them to the ranks and
writes their results back with ``put_stage``. Nothing polls, no rank calls
the dock, and no Ray call is spent on the dock itself. ``GRPOTransferDock``
is the same class as a Ray actor, for upstream's pull API
(``get_experience(..., use_batch_seqlen_balance)``, consumer status, kept in
``transfer_dock_compat``), which ranks call themselves.
"""
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

import ray
import torch
from torch import Tensor

from mindspeed_rl.trainer.utils.balance_plan import BalancePlanner
from mindspeed_rl.trainer.utils.transfer_dock_compat import DEFAULT_COLUMNS, DEFAULT_CONSUMERS, UpstreamPullMixin
from mindspeed_rl.trainer.utils.columnar import ColumnBatch, ColumnStore, Packed, narrow, pack
from mindspeed_rl.trainer.utils.experience_packing import LENGTH_COLUMNS, trans_input_to_experience
from mindspeed_rl.utils.metrics import Metric



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
        self._write(experience_columns, packed, *self._checked_put(experience_columns, packed, indexes))

    def _checked_put(self, experience_columns: List[str], packed: List[Packed], indexes):
        """Every check of a put, nothing written: (rows, scalar values of the length columns)."""
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
        return rows, lengths

    def _write(self, experience_columns: List[str], packed: List[Packed], rows: Tensor, lengths: Dict[str, Tensor]):
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


class GRPOTransferDock(UpstreamPullMixin, TransferDock):
    """The GRPO dock: round plans bound to DP ranks, columnar rows, metrics.

    In the driver: ``DriverDock(prompts_num, n_samples, ...)``; as upstream's
    Ray actor: ``GRPOTransferDock.remote(prompts_num, n_samples, ...)``.
    """

    def __init__(self, prompts_num: int, n_samples_per_prompt: int, metrics=None,
                 addition_columns: Optional[List[str]] = None, addition_consumers: Optional[List[str]] = None,
                 timeout: Optional[float] = None, timeout_interval: Optional[float] = None,
                 balance_objective: str = "tokens", workload_model=None, balance_method: str = "auto",
                 seed: int = 1234, run_plan=None) -> None:
        """``run_plan`` (config_cls.RunPlan) gives the stages (``plan_stage``),
        the balance spec, seed and data timeout; the keyword settings are for
        use without a plan (upstream's pull API)."""
        if run_plan is not None:
            spec = run_plan.balance
            if spec is not None:
                balance_objective, balance_method, workload_model = spec.objective, spec.method, spec.workload
            seed, timeout = run_plan.seed, run_plan.timeouts.data_wait
        self.run_plan = run_plan
        if ray.is_initialized() and ray.get_runtime_context().get_actor_id():
            torch.set_num_threads(1)  # the dock actor moves small buffers; intra-op threads only add latency
        # the plan's stage outputs are columns too (e.g. the rollout engine's log-probs)
        planned = [c for st in run_plan.stages.values() for c in st.outputs] if run_plan is not None else []
        columns = list(dict.fromkeys(list(DEFAULT_COLUMNS) + list(addition_columns or []) + planned))
        self.experience_consumers = list(DEFAULT_CONSUMERS) + [
            c for c in addition_consumers or [] if c not in DEFAULT_CONSUMERS]
        super().__init__(prompts_num, n_samples_per_prompt, columns, timeout, timeout_interval)
        self.metrics = metrics if metrics is not None else Metric()
        self.planner = BalancePlanner(objective=balance_objective, workload_model=workload_model,
                                      method=balance_method, seed=seed)
        self.seed = seed
        self.round = 0
        self._reset_consumers()

    def _reset_consumers(self):
        """Start a round: plans forgotten, random draws seeded by (seed, round)."""
        self.planner.reset(self.round)
        self._generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.round)
        self._stage_plans: Dict[str, List[List[List[int]]]] = {}
        self._reset_pull_state()

    # ------------------------------------------------------------ metrics

    def get_metrics(self):
        return self.metrics

    def update_metrics(self, key="", value=None, cumulate=False):
        self.metrics.update(key, value, cumulate=cumulate)

    def get_balance_history(self):
        """Per-share loads of every balance plan since the last call."""
        return self.planner.pop_history()

    def round_summary(self) -> dict:
        """The round's dock metrics and its balance plans, in one call."""
        return {"metrics": self.metrics.compute(), "balance": self.planner.pop_history()}

    # ------------------------------------------------------------ put

    def put_experience(self, data_dict: Dict[str, Union[Tensor, List[Tensor]]], indexes: List[int] = None):
        """Write ``data_dict`` (column -> rows) at ``indexes``; a ColumnBatch that
        came through Ray is written straight from its per-column buffers."""
        if indexes is None or len(indexes) == 0:
            raise ValueError("put experience: indexes must be provided")
        self._put_packed(*self._as_packed(data_dict), indexes)

    @staticmethod
    def _as_packed(data_dict) -> Tuple[List[str], List[Packed]]:
        """(columns, one packed buffer per column); a ColumnBatch that came through Ray
        is taken straight from its per-column buffers."""
        packed = getattr(data_dict, "_packed", None)
        if packed is not None:
            return list(packed), [narrow(p) for p in packed.values()]
        columns, experience = trans_input_to_experience(data_dict)
        return columns, [pack(c, list(v)) for c, v in zip(columns, experience)]

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

    def start_round(self, batch: Dict[str, Union[Tensor, List[Tensor]]],
                    dataset_additional_keys: Optional[List[str]] = None):
        """Next round: forget the last one and put its prompts (one call)."""
        self.clear()
        self.put_prompts_experience(batch, dataset_additional_keys)

    # ------------------------------------------------------------ driver-pushed path

    def _stage_plan(self, name: str):
        if self.run_plan is None:
            raise ValueError(f"plan_stage('{name}'): this dock was built without a run_plan")
        if name not in self.run_plan.stages or not self.run_plan.stages[name].is_dp:
            raise ValueError(f"plan_stage: the run plan has no DP stage '{name}'; it has "
                             f"{[s.name for s in self.run_plan.dp_stages]}")
        return self.run_plan.stages[name]

    def _require(self, columns: Sequence[str], rows: Tensor, who: str):
        """Every cell must be there: the driver runs stages in order, so a gap is a bug, not a wait."""
        missing = self._missing(columns, rows)
        if missing:
            detail = "; ".join(f"'{c}' rows {r[:16]}{' ...' if len(r) > 16 else ''}" for c, r in missing.items())
            raise RuntimeError(f"transfer dock: {who} needs data that was never put: {detail}")

    def plan_stage(self, name: str) -> List[List[List[int]]]:
        """The round's plan of DP stage ``name``: for each DP rank, its shares
        (row lists, in the order the rank runs them). Share s goes to rank
        s % dp. Planned once per round; later calls return the same plan.
        A round with fewer rows than the stage plans for (DAPO dynamic sampling)
        is cut into the same number of shares, sizes differing by at most one row."""
        if name in self._stage_plans:
            return self._stage_plans[name]
        stage = self._stage_plan(name)
        dp = self.run_plan.layout_of(stage.role).dp
        n_rows, full = self._round_rows(), stage.planned_rows * dp
        if n_rows > full or n_rows < dp * stage.shares_per_rank:
            raise RuntimeError(f"plan_stage('{name}'): the round holds {n_rows} rows; the stage takes at most "
                               f"{full}, at least one per share of its {dp * stage.shares_per_rank} shares")
        all_rows = torch.arange(n_rows)
        self._require(list(dict.fromkeys(stage.inputs + stage.cost_columns)), all_rows, f"stage '{name}'")
        n_shares = None if n_rows == full else dp * stage.shares_per_rank
        shares = self.planner.make_plan(name, all_rows, stage.rows_per_share, self._row_lengths(stage.cost_columns),
                                        self.metrics, balanced=stage.balanced, n_shares=n_shares)
        if len(shares) != dp * stage.shares_per_rank:
            raise RuntimeError(f"plan_stage('{name}'): the plan has {len(shares)} shares, the run plan "
                               f"expects {dp * stage.shares_per_rank}")
        if self.planner.history:  # for reports: which DP rank each share goes to
            self.planner.history[-1]["ranks"] = [s % dp for s in range(len(shares))]
        rows = [u.tolist() for u in shares]
        plan = [[rows[k * dp + r] for k in range(stage.shares_per_rank)] for r in range(dp)]
        self._stage_plans[name] = plan
        return plan

    def _round_rows(self) -> int:
        """Rows of this round: the prompts put, rows 0 .. n-1 (a full round fills the dock)."""
        ready = self.experience_data_status["prompts"]
        n = int(ready.sum())
        if n < self.max_len and bool(ready[n:].any()):
            raise RuntimeError("transfer dock: the round's prompts are not rows 0 .. n-1")
        return n

    def _names(self, name) -> Tuple[str, ...]:
        """A stage name, or the names of DP stages that run together on one plan."""
        names = (name,) if isinstance(name, str) else tuple(name)
        if not names:
            raise ValueError("no stage named")
        plan = self.plan_stage(names[0])
        for other in names[1:]:
            if self.plan_stage(other) != plan:
                raise ValueError(f"stages {list(names)} cannot run together: '{other}' has another plan "
                                 f"than '{names[0]}'")
        return names

    def dispatch(self, name) -> list:
        """``[plan, batch_0, ..., batch_{dp-1}]`` for DP stage ``name`` (or a
        tuple of stages with the same plan, which then run in one call): the
        round's plan and, for each DP rank, its rows of the stages' inputs (its
        shares concatenated, in order; one buffer per column through Ray). On the
        actor, call with ``.options(num_returns=dp + 1)`` so each batch is its own object."""
        names = self._names(name)
        plan = self.plan_stage(names[0])
        columns = list(dict.fromkeys(c for n in names for c in self.run_plan.stages[n].inputs))
        return [plan] + [self.get_rows(columns, [r for share in shares for r in share]) for shares in plan]

    def put_stage(self, name, *outputs) -> None:
        """Write DP stage ``name``'s results (or those of a tuple of stages
        dispatched together): ``outputs[r]`` holds DP rank r's output columns for
        its rows in plan order (all checked before any write)."""
        names = self._names(name)
        plan = self.plan_stage(names[0])
        if len(outputs) != len(plan):
            raise ValueError(f"put_stage({name!r}): {len(outputs)} outputs for {len(plan)} DP ranks")
        expected = sorted({c for n in names for c in self.run_plan.stages[n].outputs})
        parts = []
        for rank, (shares, out) in enumerate(zip(plan, outputs)):
            columns, values = self._as_packed(out)
            if sorted(columns) != expected:
                raise ValueError(f"put_stage({name!r}): rank {rank} gave columns {columns}, the stage writes "
                                 f"{expected}")
            try:
                checked = self._checked_put(columns, values, [r for share in shares for r in share])
            except ValueError as err:
                raise ValueError(f"put_stage({name!r}): rank {rank}: {err}") from err
            parts.append((columns, values, *checked))
        for part in parts:  # every rank checked before anything is written
            self._write(*part)

    def get_rows(self, experience_columns: List[str], indexes: List[int]) -> ColumnBatch:
        """``indexes``' rows of ``experience_columns`` in the order given (one
        buffer per column through Ray); every cell must have been put."""
        self._check_columns(experience_columns, "get rows")
        rows = self._check_indexes(indexes, "get rows")
        self._require(experience_columns, rows, f"get rows {list(experience_columns)}")
        with self._data_lock:  # gathered into one buffer per column: nothing to pack when pickled
            return ColumnBatch(packed={c: self.experience_data[c].packed(rows) for c in experience_columns})

    def _row_lengths(self, columns: Sequence[str]):
        """row ids -> their token counts, summed over ``columns`` (rows x 1)."""

        def lengths(rows: Tensor) -> Tensor:
            total = sum(self.experience_lengths[c] for c in columns)
            return total.view(-1, 1)[rows]
        return lengths

    # ------------------------------------------------------------ rounds

    def set_round(self, round_index: int):
        """Continue the round count (a resumed run): the next ``clear`` starts round ``round_index + 1``."""
        self.round = int(round_index)
        self._reset_consumers()

    def clear(self):
        """Forget all rows, plans and metrics (next round)."""
        self.round += 1
        self._reset_consumers()
        self.metrics.reset()
        self._clear_experience_data_and_status()


DriverDock = GRPOTransferDock  # the plain class: the trainer's dock, in the driver process
# upstream's actor: concurrent calls, so a rank's waiting get_experience never blocks the puts it waits for
GRPOTransferDock = ray.remote(max_concurrency=100)(GRPOTransferDock)
