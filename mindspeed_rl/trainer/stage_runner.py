"""Runs the stages of a round; owns a DP stage's whole I/O.

A DP stage runs as: the dock's ``dispatch`` (the round's plan and each DP
rank's rows), one call per rank on the stage's worker group (the launcher's
``run_stage`` sends each rank its command and rows; TP peers share one
object), and one ``put_stage`` with every rank's results. ``run_dp_stage``
is that sequence, and nothing else calls ``dispatch`` or ``put_stage``.

Consecutive DP stages on one worker group whose round plans coincide (the
reference and old log-probs when balanced) run together: one ``StageGroup``,
one dispatch, one call per rank, one put.

A queued stage (rollout, unless ``rl_config.rollout_balance`` is 'static') has no plan: the
round's rows go into one queue that every engine of the worker group draws from
(``run_queued_stage``), and the dock writes each row where it belongs whichever
engine made it.
"""
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NamedTuple, Sequence, Tuple, Union

from mindspeed_rl.algorithms import DRIVER_STAGES
from mindspeed_rl.balance.rollout_figures import rollout_figures

if TYPE_CHECKING:
    from mindspeed_rl.plan.run_plan import StagePlan

Metrics = Dict[str, float]


class StageRef(NamedTuple):
    """A DP stage as it travels to the ranks: its name and columns (a rank reads the rest from its run plan)."""
    name: str
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    is_dp: bool = True


@dataclass(frozen=True)
class StageGroup:
    """DP stages that run in one call per rank on one plan, in order (their roles may differ
    when one worker group serves both, e.g. 'ref' and 'actor'). In the driver the stages are
    the run plan's ``StagePlan``s; on the ranks, ``StageRef``s."""
    stages: Tuple[Union["StagePlan", StageRef], ...]

    def __post_init__(self):
        if not self.stages:
            raise ValueError("a stage group needs at least one stage")
        not_dp = [s.name for s in self.stages if not s.is_dp]
        if not_dp:
            raise ValueError(f"stage group: {not_dp} are not DP stages")

    def __reduce__(self):
        # pickled for every rank of every call: the stages' names and columns, not whole StagePlans
        return StageGroup, (tuple(StageRef(s.name, tuple(s.inputs), tuple(s.outputs)) for s in self.stages),)

    @classmethod
    def of(cls, *stages) -> "StageGroup":
        return cls(tuple(stages))

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    @property
    def name(self) -> str:
        """For messages: the stage names joined by '+'."""
        return "+".join(self.names)

    @property
    def inputs(self) -> Tuple[str, ...]:
        """Columns any of the stages reads, in order."""
        return tuple(dict.fromkeys(c for s in self.stages for c in s.inputs))

    @property
    def outputs(self) -> Tuple[str, ...]:
        """Columns any of the stages writes, in order."""
        return tuple(dict.fromkeys(c for s in self.stages for c in s.outputs))


def run_dp_stage(workers, dock, group: StageGroup, **context) -> List[Metrics]:
    """``group`` on the worker group ``workers``: dispatch, one call per rank
    with its rows and ``context`` (iteration, kl_coef), one put of every DP
    rank's results. Returns every rank's metrics."""
    plan, *batches = dock.dispatch(group)
    metrics, outputs = workers.run_stage(group, plan, batches, **context)
    if group.outputs:
        dock.put_stage(group, *outputs)
    return metrics


def run_queued_stage(workers, dock, stage, **context) -> Tuple[Metrics, List[Metrics]]:
    """A queued DP stage (rollout) on ``workers``: the dock's round goes into the group's queue, every
    engine takes rows until it is drained, the dock writes what each made (one put), and the round's
    balance figures are recorded. Returns (the figures, every rank's metrics)."""
    group = StageGroup.of(stage)
    queued = dock.queue_round(group)
    metrics, made = workers.run_queued_stage(group, queued, **context)
    dock.put_queued(group, queued.order, [(trace["rows"], out) for out, trace in made])
    figures, plan = rollout_figures(dock, stage, queued, [trace for _, trace in made])
    dock.record_plan(plan)
    return figures, metrics


class StageRunner:
    """Runs stages in order on ``dock``'s round: a driver stage by its registered function ``fn(driver, stage)``,
    DP stages in groups on the worker group of their role (``groups``: role -> worker group)."""

    def __init__(self, dock, groups: Mapping[str, Any]):
        self.dock, self.groups = dock, groups

    def workers(self, stage):
        group = self.groups.get(stage.role)
        if group is None:
            raise ValueError(f"stage '{stage.name}' runs on role {stage.role!r}, which has no worker group")
        return group

    def _joins(self, stage, stages: List[Any]) -> bool:
        """Whether DP ``stage`` can run with ``stages``: the same worker group, none
        of their outputs among its inputs, and the same plan."""
        if not stage.is_dp or getattr(stage, "queued", False) or self.workers(stage) is not self.workers(stages[0]):
            return False
        if set(stage.inputs) & {c for s in stages for c in s.outputs}:
            return False
        return self.dock.plan_stage(stage.name) == self.dock.plan_stage(stages[0].name)

    def take_group(self, stages: Sequence[Any], start: int) -> StageGroup:
        """The DP stage ``stages[start]`` and the stages after it that run with it."""
        together = [stages[start]]
        for stage in stages[start + 1:]:
            if not self._joins(stage, together):
                break
            together.append(stage)
        return StageGroup(tuple(together))

    def run(self, stages: Sequence[Any], driver, **context) -> Tuple[Metrics, List[Metrics]]:
        """(the driver stages' metrics, every rank's metrics of the DP stages)."""
        metrics, results = {}, []
        i = 0
        while i < len(stages):
            stage = stages[i]
            if not stage.is_dp:
                fn: Callable[[Any, Any], Metrics] = DRIVER_STAGES.get(stage.method)
                metrics.update(fn(driver, stage))
                i += 1
                continue
            if getattr(stage, "queued", False):
                figures, ranks = run_queued_stage(self.workers(stage), self.dock, stage, **context)
                metrics.update(figures)
                results += ranks
                i += 1
                continue
            group = self.take_group(stages, i)
            i += len(group.stages)
            results += run_dp_stage(self.workers(stage), self.dock, group, **context)
        return metrics, results
