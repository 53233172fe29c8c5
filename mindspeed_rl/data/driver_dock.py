"""The driver's transfer dock: the store between the stages of a round.

Rows are samples (``prompts_num * n_samples_per_prompt``, a GRPO group's n
samples in consecutive rows); columns are experience fields, each a
``ColumnStore`` (columnar.py).

The trainer holds a ``DriverDock`` in the driver process (verl's
single-controller shape) and the stage runner (trainer/stage_runner.py)
drives it: for a DP stage group ``dispatch`` plans the round (balanced shares,
share s to DP rank s % dp) and cuts each DP rank's rows, and ``put_stage``
writes every rank's results back in one call; driver stages read with
``get_rows`` and write with ``put_experience``. The driver runs the stages in
order, so every read finds its data: nothing here waits, polls or locks.

Upstream's pull API (a Ray actor that ranks call, ``get_experience``) lives in the
compat package (compat/transfer_dock.py); upstream's module path (trainer/utils/transfer_dock.py)
hands on both. A stage group (``group``) is the stage runner's StageGroup: its ``stages`` and ``names``.
"""
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from mindspeed_rl.balance.balance_plan import BalancePlanner
from mindspeed_rl.data.columnar import ColumnBatch, ColumnStore, FlatRows, LengthStore, value_rows
from mindspeed_rl.data.row_lists import column_parts, trans_input_to_experience  # noqa: F401  (upstream's name)
from mindspeed_rl.utils.metrics import Metric
from mindspeed_rl.balance.rollout_queue import PromptLengths, StopRule

# the columns a round starts with (put_prompts_experience)
PROMPT_COLUMNS = ("prompts", "prompt_length")
# columns of one number per row (a length), each kept as one int64 tensor (LengthStore) for vectorised sums
LENGTH_COLUMNS = ("prompt_length", "response_length", "input_ids_length")


class QueueRound(NamedTuple):
    """A queued stage's round as its queue loads it (``DriverDock.queue_round``)."""
    order: List[int]      # row ids in queue order
    batch: ColumnBatch    # their inputs, in that order
    groups: List[int]     # each row's GRPO group
    prior: List[float]    # its group's expected response length (NaN: unknown)
    stop: Optional[StopRule] = None  # the round may end before every row is served (partial rollout's async_engine)


def group_rows(groups, n: int) -> Tensor:
    """The rows of GRPO groups ``groups``, group by group (group g holds rows n*g .. n*g+n-1)."""
    groups = torch.as_tensor(groups, dtype=torch.int64).reshape(-1)
    return (groups[:, None] * n + torch.arange(n)).reshape(-1)


def _rows_of(shares: List[List[int]]) -> Tensor:
    """A DP rank's rows: its shares of a plan, concatenated."""
    return torch.tensor([r for share in shares for r in share], dtype=torch.int64)


def plan_columns(run_plan) -> List[str]:
    """Every column the stages of ``run_plan`` read or write, in stage order (none without a plan)."""
    if run_plan is None:
        return []
    return list(dict.fromkeys(c for st in run_plan.stages.values() for c in st.inputs + st.outputs))


class DriverDock:
    """Column storage of one round, its DP plans and its metrics."""

    def __init__(self, prompts_num: int, n_samples_per_prompt: int, addition_columns: Optional[List[str]] = None,
                 run_plan=None, metrics: Optional[Metric] = None, experience_columns: Optional[List[str]] = None,
                 balance_objective: str = "tokens", workload_model=None, balance_method: str = "auto",
                 seed: int = 1234) -> None:
        """``run_plan`` (config_cls.RunPlan) gives the DP stages (``plan_stage``), the
        balance spec and the seed; the keyword balance settings and ``seed`` are for
        a dock without a plan. The columns are ``experience_columns`` when given, else
        the prompts, ``addition_columns`` (dataset keys) and every column the plan's
        stages read or write."""
        for name, value in (("prompts_num", prompts_num), ("n_samples_per_prompt", n_samples_per_prompt)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"transfer dock: {name} must be a positive int, got {value!r}")
        if run_plan is not None:
            if run_plan.balance is not None:
                spec = run_plan.balance
                balance_objective, balance_method, workload_model = spec.objective, spec.method, spec.workload
            seed = run_plan.seed
        if experience_columns is None:
            experience_columns = list(PROMPT_COLUMNS) + list(addition_columns or []) + plan_columns(run_plan)
        self.run_plan = run_plan
        self.prompts_num = prompts_num
        self.n_samples_per_prompt = n_samples_per_prompt
        self.max_len = prompts_num * n_samples_per_prompt
        self.experience_columns = list(dict.fromkeys(experience_columns))
        self.metrics = metrics if metrics is not None else Metric()
        self.planner = BalancePlanner(objective=balance_objective, workload_model=workload_model,
                                      method=balance_method, seed=seed)
        self.seed = seed
        self.prompt_lengths = PromptLengths()  # across rounds: the rollout queue's prior
        self.round = 0
        self._empty()
        self._new_round()

    # ------------------------------------------------------------ checks

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

    def _missing(self, columns: Sequence[str], rows: Tensor) -> Dict[str, List[int]]:
        missing = {}
        for column in columns:
            not_ready = rows[self.experience_data_status[column][rows] != 1]
            if not_ready.numel():
                missing[column] = not_ready.tolist()
        return missing

    def _require(self, columns: Sequence[str], rows: Tensor, who: str):
        """Every cell must be there: the driver runs stages in order, so a gap is a bug, not a wait."""
        missing = self._missing(columns, rows)
        if missing:
            detail = "; ".join(f"'{c}' rows {r[:16]}{' ...' if len(r) > 16 else ''}" for c, r in missing.items())
            raise RuntimeError(f"transfer dock: {who} needs data that was never put: {detail}")

    # ------------------------------------------------------------ storage

    def _empty(self):
        """Every column empty."""
        self.experience_data = {c: LengthStore(self.max_len) if c in LENGTH_COLUMNS else ColumnStore(self.max_len)
                                for c in self.experience_columns}
        self.experience_data_status = {c: torch.zeros(self.max_len, dtype=torch.int32)
                                       for c in self.experience_columns}
        # the length columns' one copy, by name (the planner's sums read these tensors)
        self.experience_lengths = {c: self.experience_data[c].values
                                   for c in LENGTH_COLUMNS if c in self.experience_columns}

    def _checked_put(self, columns: List[str], parts: List[FlatRows], rows: Tensor):
        """Every check of a put at valid, distinct ``rows``; nothing written."""
        self._check_columns(columns, "put experience")
        for column, part in zip(columns, parts):
            if part[1].numel() != rows.numel():
                raise ValueError(f"put experience: column '{column}' has {part[1].numel()} rows "
                                 f"but {rows.numel()} indexes were given")
            try:
                self.experience_data[column].check(column, part)
            except ValueError as err:
                raise ValueError(f"put experience: {err}") from None

    def _write(self, columns: List[str], parts: List[FlatRows], rows: Tensor):
        for column, part in zip(columns, parts):
            self.experience_data[column].put(rows, part)
            self.experience_data_status[column][rows] = 1

    @staticmethod
    def _as_flat(data_dict) -> Tuple[List[str], List[FlatRows]]:
        """(columns, one FlatRows per column), values in the dtype given; a ColumnBatch built from
        flat buffers (a gather, a driver stage's tensors, a rank's results through Ray) is taken as it is."""
        flat = getattr(data_dict, "flat", None)
        if flat is not None:
            return list(flat), list(flat.values())
        return column_parts(data_dict)

    def put_experience(self, data_dict: Dict[str, Union[Tensor, List[Tensor]]], indexes: List[int] = None):
        """Write ``data_dict`` (column -> rows) at ``indexes``; every check runs before anything is written."""
        if indexes is None or len(indexes) == 0:
            raise ValueError("put experience: indexes must be provided")
        columns, parts = self._as_flat(data_dict)
        rows = self._check_indexes(indexes, "put experience")
        self._checked_put(columns, parts, rows)
        self._write(columns, parts, rows)

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
            "prompts": [p for p in prompts for _ in range(n)],  # laid end to end by the put (one copy)
            "prompt_length": torch.tensor([p.numel() for p in prompts]).repeat_interleave(n),
        }
        for key in dataset_additional_keys or []:
            if key in batch:
                values = list(batch[key])
                if len(values) != len(prompts):
                    raise ValueError(f"put prompts: '{key}' has {len(values)} rows, prompts have {len(prompts)}")
                data[key] = [v for v in values for _ in range(n)]
        self.put_experience(data, indexes=list(range(len(prompts) * n)))

    def get_rows(self, experience_columns: List[str], indexes: List[int]) -> ColumnBatch:
        """``indexes``' rows of ``experience_columns`` in the order given (one
        buffer per column through Ray); every cell must have been put."""
        self._check_columns(experience_columns, "get rows")
        rows = self._check_indexes(indexes, "get rows")
        self._require(experience_columns, rows, f"get rows {list(experience_columns)}")
        return self._gather(experience_columns, rows)

    def _gather(self, columns: Sequence[str], rows: Tensor) -> ColumnBatch:
        """Checked ``rows`` of ``columns``, gathered into one buffer per column (nothing to flatten when pickled)."""
        return ColumnBatch(flat={c: self.experience_data[c].gather(rows) for c in columns})

    # ------------------------------------------------------------ DP stages

    def _stage_plan(self, name: str):
        if self.run_plan is None:
            raise ValueError(f"plan_stage('{name}'): this dock was built without a run_plan")
        if name not in self.run_plan.stages or not self.run_plan.stages[name].is_dp:
            raise ValueError(f"plan_stage: the run plan has no DP stage '{name}'; it has "
                             f"{[s.name for s in self.run_plan.dp_stages]}")
        return self.run_plan.stages[name]

    def plan_stage(self, name: str) -> List[List[List[int]]]:
        """The round's plan of DP stage ``name``: for each DP rank, its shares
        (row lists, in the order the rank runs them). Share s goes to rank
        s % dp. Planned once per round; later calls return the same plan.
        A round with fewer rows than the stage plans for (DAPO dynamic sampling)
        is cut into the same number of shares, sizes differing by at most one row."""
        if name in self._stage_plans:
            return self._stage_plans[name]
        stage = self._stage_plan(name)
        if stage.queued:
            raise ValueError(f"plan_stage('{name}'): the stage is served from a queue (queue_round), it has no "
                             f"plan; rl_config.rollout_balance=static binds its rows to DP ranks")
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
        if self.planner.history:  # for reports: which DP rank each share goes to
            self.planner.history[-1]["ranks"] = [s % dp for s in range(len(shares))]
        rows = [u.tolist() for u in shares]
        plan = [rows[r::dp] for r in range(dp)]  # share s to rank s % dp, in order
        stage.check_plan(plan, dp, f"plan_stage('{name}')")
        self._stage_plans[name] = plan
        return plan

    def rows_with(self, column: str) -> List[int]:
        """The rows of this round that hold ``column`` (e.g. the rows a stopped rollout served)."""
        self._check_columns([column], "rows_with")
        return torch.nonzero(self.experience_data_status[column] == 1).reshape(-1).tolist()

    def round_rows(self) -> int:
        """Rows of this round (rows 0 .. n-1)."""
        return self._round_rows()

    def _round_rows(self) -> int:
        """Rows of this round: the prompts put, rows 0 .. n-1 (a full round fills the dock)."""
        ready = self.experience_data_status["prompts"]
        n = int(ready.sum())
        if n < self.max_len and bool(ready[n:].any()):
            raise RuntimeError("transfer dock: the round's prompts are not rows 0 .. n-1")
        return n

    def _row_lengths(self, columns: Sequence[str]):
        """row ids -> their token counts, summed over ``columns`` (rows x 1)."""

        def lengths(rows: Tensor) -> Tensor:
            total = sum(self.experience_lengths[c] for c in columns)
            return total.view(-1, 1)[rows]
        return lengths

    def _group_plan(self, group) -> List[List[List[int]]]:
        """The one plan of the stages of ``group`` (they run in one call per rank)."""
        first, *others = group.names
        plan = self.plan_stage(first)
        for other in others:
            if self.plan_stage(other) != plan:
                raise ValueError(f"stages {list(group.names)} cannot run together: '{other}' has another plan "
                                 f"than '{first}'")
        return plan

    def dispatch(self, group) -> list:
        """``[plan, batch_0, ..., batch_{dp-1}]`` for the DP stages of ``group``:
        the round's plan and, for each DP rank, its rows of the stages' inputs
        (its shares concatenated, in order; one buffer per column through Ray)."""
        plan = self._group_plan(group)  # planning checked that every input of every row is there
        return [plan] + [self._gather(group.inputs, _rows_of(shares)) for shares in plan]

    # ------------------------------------------------------------ a queued stage (rollout)

    def queue_round(self, group) -> "QueueRound":
        """The queued stage of ``group`` as its queue loads it: every row of the round in queue order (rows
        0 .. n-1), their inputs in that order, each row's GRPO group and the group's expected response length
        (its prompt's mean in the last round it came in, ``PromptLengths``; NaN: never seen)."""
        if len(group.names) != 1:
            raise ValueError(f"queue_round: a queued stage runs alone, got {list(group.names)}")
        stage = self._stage_plan(group.names[0])
        if not stage.queued:
            raise ValueError(f"queue_round: stage '{stage.name}' is planned, not queued")
        order = torch.arange(self._round_rows())
        self._require(list(dict.fromkeys(stage.inputs + stage.cost_columns)), order, f"stage '{stage.name}'")
        if self._queue_groups is not None:  # a round of rows that are not whole groups (partial rollout)
            groups, prior, stop = self._queue_groups
            if len(groups) != order.numel():
                raise ValueError(f"queue_round: {len(groups)} queue groups for a round of {order.numel()} rows")
            return QueueRound(order.tolist(), self._gather(group.inputs, order), list(groups), list(prior), stop)
        n = self.n_samples_per_prompt
        firsts = order[::n]
        prior = self.prompt_lengths.expect(self.experience_data["prompts"].views(firsts))
        groups = order // n
        return QueueRound(order.tolist(), self._gather(group.inputs, order), groups.tolist(),
                          prior[groups.numpy()].tolist())

    def set_queue_groups(self, groups: Sequence[int], prior: Sequence[float], stop: Optional[StopRule] = None):
        """This round's rows by queue group, and each row's group's expected length (instead of whole GRPO
        groups of consecutive rows and the prompts' earlier lengths); ``stop``: the round may end before every
        row is served (its put then covers the rows served). The next round forgets them."""
        self._queue_groups = (list(groups), list(prior), stop)

    def put_queued(self, group, order: Sequence[int], made: Sequence[Tuple[Sequence[int], object]]):
        """Write what the consumers of a queued stage made: ``made[k]`` = (row ids, output columns in that
        order) of consumer k. Together the rows must be ``order`` exactly once each (of a round that may stop
        early, at most once each); every check runs before anything is written."""
        name = f"put_queued({group.name!r})"
        none = torch.zeros(0, dtype=torch.int64)
        rows = [torch.as_tensor(list(r), dtype=torch.int64) for r, _ in made]
        every = torch.cat([none] + rows)
        owner = torch.cat([none] + [torch.full((r.numel(),), k) for k, r in enumerate(rows)])
        ranked, index = every.sort()
        twice = (ranked[1:] == ranked[:-1]).nonzero()
        if twice.numel():
            i = int(twice[0, 0])
            raise ValueError(f"{name}: row {int(ranked[i])} was made by consumers {int(owner[index[i]])} and "
                             f"{int(owner[index[i + 1]])}")
        want = torch.as_tensor(list(order), dtype=torch.int64).sort().values
        stoppable = self._queue_groups is not None and self._queue_groups[2] is not None
        if stoppable and bool(torch.isin(ranked, want).all()):
            want = ranked  # a stopped round: the rows it served
        if not torch.equal(ranked, want):
            missing = want[~torch.isin(want, ranked)].tolist()
            extra = ranked[~torch.isin(ranked, want)].tolist()
            raise ValueError(f"{name}: the consumers' rows do not cover the round: missing {missing[:16]}, "
                             f"not in the round {extra[:16]}")
        expected, checked = sorted(group.outputs), []
        for consumer, ((_, out), mine) in enumerate(zip(made, rows)):
            if not mine.numel():
                continue
            try:
                columns, parts = self._as_flat(out)
                if sorted(columns) != expected:
                    raise ValueError(f"gave columns {columns}, the stage writes {expected}")
                self._checked_put(columns, parts, mine)  # the rows are the round's: valid and distinct
            except ValueError as err:
                raise ValueError(f"{name}: consumer {consumer}: {err}") from None
            checked.append((columns, parts, mine))
        for part in checked:  # every consumer checked before anything is written
            self._write(*part)
        if self._queue_groups is None:
            self._remember_lengths(want.numel())

    def _remember_lengths(self, rows: int) -> None:
        """Each group's mean response length in this round's ``rows`` rows (0 .. rows-1, whole groups), for the
        next rounds' queue order."""
        n = self.n_samples_per_prompt
        lengths = self.experience_lengths["response_length"][:rows].double().view(-1, n).mean(dim=1)
        self.prompt_lengths.update(self.experience_data["prompts"].views(torch.arange(0, rows, n)), lengths.tolist())

    def record_plan(self, plan: dict) -> None:
        """Keep a plan made outside the planner (a queued stage's served rows and times) for the round's report."""
        self.planner.history.append(plan)

    def put_stage(self, group, *outputs) -> None:
        """Write the results of ``group``'s stages: ``outputs[r]`` holds DP rank
        r's output columns for its rows in plan order (all checked before any write)."""
        plan = self._group_plan(group)
        if len(outputs) != len(plan):
            raise ValueError(f"put_stage({group.name!r}): {len(outputs)} outputs for {len(plan)} DP ranks")
        expected = sorted(group.outputs)
        checked = []
        for rank, (shares, out) in enumerate(zip(plan, outputs)):
            columns, parts = self._as_flat(out)
            if sorted(columns) != expected:
                raise ValueError(f"put_stage({group.name!r}): rank {rank} gave columns {columns}, the stage writes "
                                 f"{expected}")
            rows = _rows_of(shares)  # the plan's: valid and distinct
            try:
                self._checked_put(columns, parts, rows)
                checked.append((columns, parts, rows))
            except ValueError as err:
                raise ValueError(f"put_stage({group.name!r}): rank {rank}: {err}") from err
        for part in checked:  # every rank checked before anything is written
            self._write(*part)

    # ------------------------------------------------------------ rounds

    def _new_round(self):
        """Plans forgotten; the planner's random draws seeded by (seed, round)."""
        self.planner.reset(self.round)
        self._stage_plans: Dict[str, List[List[List[int]]]] = {}
        self._queue_groups = None

    def set_round(self, round_index: int):
        """Continue the round count (a resumed run): the next ``clear`` starts round ``round_index + 1``."""
        self.round = int(round_index)
        self._new_round()

    def clear(self):
        """Forget all rows, plans and metrics (next round)."""
        self.round += 1
        self._new_round()
        self.metrics.reset()
        self._empty()

    def start_round(self, batch: Dict[str, Union[Tensor, List[Tensor]]],
                    dataset_additional_keys: Optional[List[str]] = None):
        """Next round: forget the last one and put its prompts (one call)."""
        self.clear()
        self.put_prompts_experience(batch, dataset_additional_keys)

    def round_summary(self) -> dict:
        """The round's dock metrics and its balance plans, in one call."""
        return {"metrics": self.metrics.compute(), "balance": self.planner.pop_history()}


def put_columns(td, columns: Dict[str, Union[torch.Tensor, FlatRows]], rows) -> None:
    """One put, one buffer per column: a (rows,) tensor is one number per row, a FlatRows (e.g.
    ``unpadded_rows`` of a padded result) is taken as it is; no per-row tensors are made."""
    flat = {k: value_rows(v) if isinstance(v, torch.Tensor) else v for k, v in columns.items()}
    td.put_experience(ColumnBatch(flat=flat), rows)
