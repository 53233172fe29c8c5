"""The run plan's types: the layout of a worker group, the sized stages, the features' specs and ``RunPlan``,
the one object the launcher, workers, trainer and dock read (built by run_plan.build_run_plan)."""
import dataclasses
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mindspeed_rl.algorithms.spec import AdvantageSpec
from mindspeed_rl.balance.workload import WorkloadModel
from mindspeed_rl.plan import stages as table
from mindspeed_rl.plan.multi_turn import FREE, MultiTurnSpec
from mindspeed_rl.plan.partial_rollout import PartialSpec
from mindspeed_rl.plan.rollout_correction import CorrectionSpec
from mindspeed_rl.plan.stages import Features, Stage
from mindspeed_rl.plan.trainer_mode import SYNC, AsyncSpec
from mindspeed_rl.plan.worker_spec import WorkerSpec, default_worker_spec

SUPPORTED_LAYOUTS = "DP x TP; pipeline, context and expert parallel ranks are folded into DP"
# layout keys served by FSDP over the same devices instead
FOLDED = ("pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size")


class PlanError(ValueError):
    """The configs describe a run this implementation cannot carry out."""


@dataclass(frozen=True)
class Layout:
    world_size: int  # worker processes (devices)
    dp: int
    tp: int
    # ddp: replicas; tp: DTensor TP weights, grads averaged over dp; fsdp: FSDP2 over dp (+ TP)
    engine: str = "ddp"
    asked: str = ""  # the config's layout when another one runs instead (PP / CP / EP folded into DP)
    note: str = ""   # the one line that says which layout runs instead and why
    # Ray custom resources each worker asks for besides its CPU and device (rl_config.<group>_resource
    # .custom_resources): the group lands on the nodes that offer them
    resources: Tuple[Tuple[str, float], ...] = ()


@dataclass(frozen=True)
class BalanceSpec:
    objective: str = "tokens"   # 'tokens' or 'flops'
    method: str = "auto"
    workload: Optional[WorkloadModel] = None  # set for 'flops'


@dataclass(frozen=True)
class OverlongSpec:
    """DAPO overlong reward shaping: responses longer than ``max_tokens - buffer``
    lose up to ``penalty_factor`` reward, linearly over the last ``buffer`` tokens."""
    buffer: int
    penalty_factor: float
    max_tokens: int  # rl_config.rollout_max_tokens (= sampling_config.max_tokens)


@dataclass(frozen=True)
class GroupFilterSpec:
    """DAPO dynamic sampling: groups whose ``metric`` (a verifier's own score) is
    the same for every sample are dropped; rollout batches are added until
    ``train_prompts`` groups are kept or ``max_batches`` batches ran (<= 0: no limit)."""
    metric: str
    train_prompts: int
    max_batches: int


@dataclass(frozen=True)
class RolePlan:
    """A worker group other than the actor's: its layout and what its workers read."""
    layout: "Layout"
    worker: WorkerSpec


@dataclass(frozen=True)
class StagePlan:
    """One stage of this run (a row of the stage table, sized). For a ``dp``
    stage share s of the round's plan goes to DP rank s % dp (dp of the stage's
    role, ``RunPlan.layout_of``) and every rank takes ``shares_per_rank``
    shares; a driver stage takes the whole round."""
    name: str
    rows_per_share: int
    shares_per_rank: int
    balanced: bool        # balanced by workload (else a seeded random split)
    config_key: str = ""  # the key that sets rows_per_share, for messages
    stage: Optional[Stage] = None
    inputs: Tuple[str, ...] = ()  # columns this run's stage reads (the table's, plus optional ones)
    extra_outputs: Tuple[str, ...] = ()  # columns this run's stage writes besides the table's
    queued: bool = False  # served from one queue of the round (rows_per_share: rows per take at most)

    @property
    def phase(self) -> str:
        return self.stage.phase if self.stage else "train"

    @property
    def planned_rows(self) -> int:
        """Rows one DP rank gets in a full round of this stage (a filtered round may hold fewer)."""
        return self.rows_per_share * self.shares_per_rank

    @property
    def kind(self) -> str:
        return self.stage.kind if self.stage else "dp"

    def check_plan(self, plan: List[List[List[int]]], dp: int, who: str) -> None:
        """A round's plan of this stage has ``dp`` ranks of ``shares_per_rank`` shares each
        (the dock checks what it planned, every rank what it got); ValueError naming ``who``."""
        if len(plan) != dp:
            raise ValueError(f"{who}: stage '{self.name}' plan has {len(plan)} DP ranks, the layout {dp}")
        for rank, shares in enumerate(plan):
            if len(shares) != self.shares_per_rank:
                raise ValueError(f"{who}: stage '{self.name}' gives DP rank {rank} {len(shares)} shares, the run "
                                 f"plan {self.shares_per_rank}")

    @property
    def is_dp(self) -> bool:
        return self.kind == "dp"

    @property
    def method(self) -> str:
        return self.stage.method

    @property
    def role(self) -> str:
        return self.stage.role

    @property
    def outputs(self) -> Tuple[str, ...]:
        return (self.stage.outputs if self.stage else ()) + self.extra_outputs

    @property
    def cost_columns(self) -> Tuple[str, ...]:
        return self.stage.cost_columns if self.stage else table.LENGTH_COST


@dataclass(frozen=True)
class Timeouts:
    td_timeout: float     # rl_config.td_timeout: the pull API waiting for rows; the default stage deadline
    collective: float     # torch.distributed process-group timeout
    placement: float      # Ray placement group to become ready
    stage: Optional[float] = None  # one command on the worker group (stage, save, load); None: td_timeout

    @property
    def stage_deadline(self) -> float:
        return self.td_timeout if self.stage is None else self.stage


@dataclass(frozen=True)
class RunPlan:
    layout: Layout
    prompts_per_round: int     # global_batch_size
    n_samples: int             # n_samples_per_prompt
    mini_batch_rows: int       # samples per optimizer step over all DP ranks
    epochs: int
    train_iters: int
    stages: Dict[str, StagePlan] = field(default_factory=dict)
    balance: Optional[BalanceSpec] = None
    seed: int = 1234
    timeouts: Timeouts = Timeouts(600.0, 660.0, 600.0)
    train_prompts_per_round: Optional[int] = None  # DAPO filter_groups_train_batch_size; else prompts_per_round
    overlong: Optional[OverlongSpec] = None
    group_filter: Optional[GroupFilterSpec] = None
    # what a worker reads of the configs (plain values); the default is the config classes' defaults,
    # for plans built by hand - build_run_plan always fills it from the configs
    worker: WorkerSpec = field(default_factory=default_worker_spec)
    placement: str = "auto"  # rl_config.placement_strategy (the launcher resolves 'auto')
    features: Features = Features()
    critic: Optional[RolePlan] = None  # PPO's critic group (critic_config, critic_resource)
    advantage: AdvantageSpec = AdvantageSpec()  # rl_config.adv_estimator and what it reads
    partial: Optional[PartialSpec] = None  # partial_rollout_max_split > 1
    correction: CorrectionSpec = CorrectionSpec()  # rl_config.rollout_correction
    multi_turn: Optional[MultiTurnSpec] = None  # rl_config.multi_turn_enable: conversations with tools
    trainer_mode: str = SYNC  # rl_config.trainer_mode: the step function (trainer/modes)
    asynchronous: Optional[AsyncSpec] = None  # the async modes' schedule and their own rollout engines

    @property
    def gae(self) -> Optional[AdvantageSpec]:
        """The advantage spec when the estimator reads a critic's values (PPO's GAE), else None."""
        return self.advantage if self.advantage.critic else None

    @property
    def rows_per_round(self) -> int:
        """Rows of one rollout batch (global_batch_size prompts)."""
        return self.prompts_per_round * self.n_samples

    @property
    def train_rows_per_round(self) -> int:
        """Rows the train stages take per iteration (at most; dynamic sampling may keep fewer)."""
        return (self.train_prompts_per_round or self.prompts_per_round) * self.n_samples

    @property
    def dock_prompts(self) -> int:
        """Groups the dock must hold: a rollout batch or a train batch, whichever is larger (partial rollout:
        the pool of prompts in flight)."""
        if self.partial is not None:  # a pass's rows or, with dynamic sampling, the kept train batch
            return max(self.partial.pool_prompts, self.train_prompts_per_round or 0)
        return max(self.prompts_per_round, self.train_prompts_per_round or 0)

    @property
    def mini_batches(self) -> int:
        """Optimizer steps per epoch of one iteration."""
        return self.train_rows_per_round // self.mini_batch_rows

    @property
    def steps_per_iteration(self) -> int:
        return self.mini_batches * self.epochs

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps of the whole run (the LR schedule's length)."""
        return self.train_iters * self.steps_per_iteration

    @property
    def rollout_consumers(self) -> int:
        """Engines that draw from the rollout queue independently: every rank with vLLM (each holds the
        whole model), one per TP group with transformers generate (a TP-sharded model generates together)."""
        return self.layout.world_size if self.worker.rollout.backend == "vllm" else self.layout.dp

    def rollout_takes(self, stage: "StagePlan") -> Tuple[Optional[int], Optional[int]]:
        """(chunk, cap) of the queue of ``stage``: fixed chunks of rows_per_share rows for transformers
        generate (one batch per take), else continuous takes of at most rows_per_share rows (vLLM)."""
        if self.worker.rollout.backend == "vllm":
            return None, stage.rows_per_share
        return stage.rows_per_share, None

    @property
    def rollout_handoff(self) -> bool:
        """The rollout queue routes a conversation's next turn to any engine (rl_config.multi_turn_routing=free)."""
        return self.multi_turn is not None and self.multi_turn.routing == FREE

    def _queue_summary(self, stage: "StagePlan") -> str:
        chunk, cap = self.rollout_takes(stage)
        takes = f"chunks of {chunk} rows" if chunk else f"takes of at most {cap} rows"
        return f"one queue of {self.rows_per_round} rows over {self.rollout_consumers} engine(s), {takes}"

    def layout_of(self, role: str) -> Layout:
        """The layout of the worker group that runs ``role``'s stages ('actor' and 'ref' share one)."""
        if role in ("actor", "ref"):
            return self.layout
        if role == "critic" and self.critic is not None:
            return self.critic.layout
        raise PlanError(f"the run plan has no worker group for role {role!r}")

    def for_group(self, role: str) -> "RunPlan":
        """The plan a worker group of ``role`` is started with: its own layout and worker spec."""
        if role in ("actor", "ref"):
            return self
        if role == "critic" and self.critic is not None:
            return dataclasses.replace(self, layout=self.critic.layout, worker=self.critic.worker)
        if role == "rollout" and self.asynchronous is not None:  # one whole model per engine, no collective
            return dataclasses.replace(self, layout=dataclasses.replace(self.layout, engine="ddp"))
        raise PlanError(f"the run plan has no worker group for role {role!r}")

    @property
    def roles(self) -> Tuple[str, ...]:
        """Worker groups this run starts ('actor' always; 'critic' for PPO)."""
        return (("actor",) + (("critic",) if self.critic is not None else ())
                + (("rollout",) if self.asynchronous is not None else ()))

    @property
    def uses_reference(self) -> bool:
        return table.REF.name in self.stages

    @property
    def computes_old_log_prob(self) -> bool:
        return table.OLD.name in self.stages

    @property
    def dp_stages(self) -> List[StagePlan]:
        return [s for s in self.stages.values() if s.is_dp]

    def phase_stages(self, phase: str) -> List[StagePlan]:
        """This run's stages of ``phase`` ('rollout' or 'train'), in order."""
        return [s for s in self.stages.values() if s.phase == phase]

    @property
    def min_train_rows(self) -> int:
        """Fewest rows a train round may hold: one per share of every DP train stage."""
        return max([s.shares_per_rank * self.layout_of(s.role).dp for s in self.phase_stages("train") if s.is_dp]
                   or [1])

    def long_tail_lines(self) -> List[str]:
        """The plan's lines for multi-turn rollouts, partial rollout and rollout correction (none when all are
        off)."""
        return ([self.multi_turn.describe()] if self.multi_turn is not None else []) + (
            [self.partial.describe(self.group_filter is not None)] if self.partial is not None else []) + (
            [self.correction.describe()] if self.correction.on else [])

    def stage(self, name: str) -> StagePlan:
        if name not in self.stages:
            raise KeyError(f"run plan has no stage '{name}'; it runs {list(self.stages)}")
        return self.stages[name]

    def summary(self) -> str:
        parts = [f"{s.name}: " + (self._queue_summary(s) if s.queued else f"{s.shares_per_rank} x {s.rows_per_share} "
                                  f"rows/rank{' balanced' if s.balanced else ''}") for s in self.dp_stages]
        critic = self.critic.layout if self.critic is not None else None
        return (f"layout DP={self.layout.dp} TP={self.layout.tp} ({self.layout.world_size} workers, "
                f"{self.layout.engine} engine); "
                + (f"critic DP={critic.dp} TP={critic.tp} ({critic.world_size} workers, {critic.engine} engine); "
                   if critic else "")
                + f"{self.rows_per_round} rows per round; " + "; ".join(parts))
