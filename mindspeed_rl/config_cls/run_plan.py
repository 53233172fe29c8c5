"""The run plan: every number of a run's layout, derived once from the configs.

The launcher, workers, trainer and transfer dock all take this one object;
none of them re-derives a layout, a row count or a dispatch size.
"""
import dataclasses
import sys
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mindspeed_rl.algorithms import ADV_ESTIMATORS
from mindspeed_rl.algorithms.spec import AdvantageSpec
from mindspeed_rl.config_cls import stages as table
from mindspeed_rl.config_cls.multi_turn import DEFAULT_ROUTING, FREE, STICKY, MultiTurnSpec, multi_turn_spec
from mindspeed_rl.config_cls.partial_rollout import MAX_TOKENS_KEY, PartialSpec, partial_spec
from mindspeed_rl.config_cls.rl_config import resource_size
from mindspeed_rl.config_cls.rollout_correction import CorrectionSpec, correction_spec
from mindspeed_rl.config_cls.stages import BALANCED_STAGES, Features, Stage  # noqa: F401  (re-exported)
from mindspeed_rl.config_cls.trainer_mode import SYNC, AsyncSpec, async_spec
from mindspeed_rl.config_cls.worker_spec import WorkerSpec, default_worker_spec, worker_spec
from mindspeed_rl.balance.workload import WorkloadModel
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


def _check_rollout_layout(actor_config, generate_config):
    if generate_config.infer_pipeline_parallel_size != 1:
        raise PlanError(f"generate_config.infer_pipeline_parallel_size="
                        f"{generate_config.infer_pipeline_parallel_size} is not implemented; rollout runs "
                        f"on the actor's layout ({SUPPORTED_LAYOUTS})")
    infer_tp = generate_config.infer_tensor_parallel_size
    if infer_tp != actor_config.tensor_model_parallel_size:
        warnings.warn(f"generate_config.infer_tensor_parallel_size={infer_tp} is not implemented: rollout runs "
                      f"on the actor's layout (tensor_model_parallel_size="
                      f"{actor_config.tensor_model_parallel_size}; with vLLM every rank's engine holds the whole "
                      f"model, inference TP across ranks is not implemented)", UserWarning, stacklevel=3)


def _check_layout(actor_config, resource, section: str = "actor_config", resource_key: str = "actor_resource",
                  given_dp=None) -> Layout:
    """The DP x TP layout of one worker group: ``resource`` devices (rl_config.<resource_key>) split
    by the TP of its config ``section``; PP / CP / EP folded into DP."""
    world = resource_size(resource)
    if world is None:
        raise PlanError(f"rl_config.{resource_key}.num_npus is not set; the run plan needs the device count")
    if world < 1:
        raise PlanError(f"rl_config.{resource_key}.num_npus={world} must be at least 1 (a worker per device)")
    tp = actor_config.tensor_model_parallel_size
    if tp < 1 or world % tp:
        raise PlanError(f"rl_config.{resource_key}.num_npus={world} must be divisible by "
                        f"{section}.tensor_model_parallel_size={tp}")
    folded = {key: getattr(actor_config, key) for key in FOLDED}
    for key, value in folded.items():
        if not isinstance(value, int) or value < 1:
            raise PlanError(f"{section}.{key}={value!r} must be a positive int")
    pp, cp, ep = (folded[k] for k in FOLDED)
    if world % (tp * pp * cp):
        raise PlanError(f"rl_config.{resource_key}.num_npus={world} must be divisible by tensor x pipeline x "
                        f"context parallel = {tp} x {pp} x {cp}")
    asked_dp = world // (tp * pp * cp)
    if asked_dp % ep:
        raise PlanError(f"{section}.expert_model_parallel_size={ep} must divide the data parallel size "
                        f"{asked_dp} ({world} devices / (TP {tp} x PP {pp} x CP {cp}))")
    dp = world // tp
    if given_dp not in (None, dp):
        raise PlanError(f"generate_config.data_parallel_size={given_dp} disagrees with the layout's data "
                        f"parallel size {dp}; leave it unset (it is derived)")
    _check_tp_divides_model(actor_config, tp, section)
    asked = note = ""
    if pp * cp * ep > 1:
        # not implemented as such: the same devices run FSDP over the folded ranks (same math: the
        # full model, full sequences and all experts are gathered per layer on every rank)
        parts = [f"TP={tp}"] + [f"{name}={v}" for name, v in (("PP", pp), ("CP", cp), ("EP", ep)) if v > 1]
        asked = " x ".join(parts + [f"DP={asked_dp}"])
        names = [n for n, v in (("pipeline", pp), ("context", cp), ("expert", ep)) if v > 1]
        extra = f"; num_layer_list={actor_config.num_layer_list} has no stages to size" \
            if actor_config.num_layer_list is not None else ""
        whose = "" if section == "actor_config" else f" of {section}"
        note = (f"layout{whose}: the config asks for {asked} on {world} devices; runs DP={dp} x TP={tp} with the "
                f"sharded engine (FSDP2 over {dp} DP ranks) on the same {world} devices, because "
                f"{' and '.join(names)} parallelism {'are' if len(names) > 1 else 'is'} not implemented; the training "
                f"math is the same{extra}")
        print(note, file=sys.stderr, flush=True)
    if actor_config.use_distributed_optimizer or asked:
        if dp == 1:
            where = "megatron_training" if section == "actor_config" else section
            raise PlanError(f"{where}.use_distributed_optimizer=true shards over data parallel ranks, "
                            f"but the layout has DP=1 ({world} devices / TP {tp}); set it to false")
        engine = "fsdp"
    else:
        engine = "tp" if tp > 1 else "ddp"
    custom = tuple(sorted((resource.get("custom_resources") or {}).items())) if isinstance(resource, dict) else ()
    return Layout(world_size=world, dp=dp, tp=tp, engine=engine, asked=asked, note=note, resources=custom)


def _family_splits_attention(family: str) -> bool:
    """Whether the installed transformers' TP plan of ``family`` splits attention heads (models/sharding.py)."""
    from transformers import AutoConfig
    from mindspeed_rl.models.sharding import splits_attention
    return splits_attention(AutoConfig.for_model(family))


def _check_tp_divides_model(cfg, tp, section="actor_config"):
    """TP must split evenly what the engine splits for the model's family (its HF ``base_model_tp_plan``,
    models/sharding.py; checked again on the model by the engine): attention heads and KV heads, except
    DeepSeek-V3's MLA where transformers' plan leaves it whole; the dense MLP where the family has dense layers (none in
    Qwen3-MoE; DeepSeek-V3's first_k_dense_replace, HF default 3); DeepSeek-V3's shared experts. Routed
    experts are never split over TP (FSDP shards them over DP). DeepSeek-V3's heads count when the installed
    transformers' plan splits MLA (from 5.25)."""
    from mindspeed_rl.config_cls.model_arch import has_model_section, model_family
    if tp <= 1 or not has_model_section(cfg):
        return
    family = model_family(cfg)
    sizes = []
    if family != "deepseek_v3":
        kv = cfg.num_query_groups if cfg.group_query_attention else cfg.num_attention_heads
        sizes += [("num_attention_heads", cfg.num_attention_heads), ("num_query_groups", kv)]
    elif _family_splits_attention(family):  # transformers' DeepSeek-V3 plan splits MLA by heads (5.25 on)
        sizes.append(("num_attention_heads", cfg.num_attention_heads))
    dense = {"qwen3_moe": 0, "deepseek_v3": getattr(cfg, "first_k_dense_replace", None)}.get(family, 1)
    if dense is None or dense > 0:
        sizes.append(("ffn_hidden_size", cfg.ffn_hidden_size))
    shared = getattr(cfg, "n_shared_experts", None)
    shared = 1 if shared is None else shared
    moe_ffn = getattr(cfg, "moe_ffn_hidden_size", None)
    if family == "deepseek_v3" and shared and moe_ffn is not None:
        sizes.append(("moe_ffn_hidden_size * n_shared_experts (shared experts)", moe_ffn * shared))
    for key, value in sizes:
        if value is not None and value % tp:
            raise PlanError(f"{section}.tensor_model_parallel_size={tp} does not divide the model's "
                            f"{key}={value}")


def _check_update_dispatch(size, layout, actor_config, mini, rows, key="actor_update_dispatch_size"):
    """Upstream's actor_update_dispatch_size: the rows an actor rank fetches per update call,
    each call cut into mini-batches of mini_batch_size // DP (upstream 2f84bab's integrated
    worker ignores it). Here each optimizer step trains on one share of mini // DP rows, so a
    size that cuts upstream's mini-batches evenly, or is not used, runs the same math."""
    if size is None or size == mini // layout.dp:
        return
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise PlanError(f"rl_config.{key}={size!r} must be a positive int")
    world, tp = layout.world_size, layout.tp
    upstream_dp = world // (tp * actor_config.pipeline_model_parallel_size * actor_config.context_parallel_size)
    per_step, per_rank = mini // upstream_dp, rows // upstream_dp
    if per_step <= size < per_rank and size % per_step:
        raise PlanError(f"rl_config.{key}={size} is not a multiple of the rows a rank trains "
                        f"per optimizer step in the config's layout (mini_batch_size // DP = {per_step}): upstream "
                        f"would train on uneven mini-batches; give a multiple of {per_step} or leave it unset")
    warnings.warn(f"rl_config.{key}={size} only sizes upstream's update fetches: each "
                  f"optimizer step here trains on mini_batch_size // DP = {mini // layout.dp} rows per rank "
                  f"(DP={layout.dp}), the same mini-batches", UserWarning, stacklevel=3)


def _stage(stage: Stage, size, default, rows, dp, balanced, inputs, outputs, queued=False) -> StagePlan:
    """A DP stage sized: ``size`` rows per share (``default`` when unset) over ``dp`` ranks."""
    key = stage.dispatch_key
    size = default if size is None else size
    if size <= 0 or rows % size:
        raise PlanError(f"rl_config.{key}={size} must be a positive divisor of the "
                        f"{rows} rows of a round (global_batch_size * n_samples_per_prompt)")
    shares = rows // size
    if shares % dp:
        raise PlanError(f"rl_config.{key}={size} gives {shares} shares per round, not a multiple of the "
                        f"data parallel size {dp}: every DP rank must take the same number of shares")
    return StagePlan(stage.name, size, shares // dp, balanced and stage.balanceable, config_key=key,
                     stage=stage, inputs=inputs, extra_outputs=outputs[len(stage.outputs):],
                     queued=queued and bool(stage.queue_method))


def _dapo(rl_config, generate_config):
    """(overlong spec, group filter spec, train prompts) of the DAPO keys, checked as upstream does."""
    overlong = group_filter = None
    # DAPO's clip-higher bounds (CISPO and GSPO may bound the ratio below more loosely than above)
    vanilla = rl_config.loss_mode in ("vanilla", None)
    if vanilla and rl_config.clip_higher_enable and rl_config.clip_ratio_low > rl_config.clip_ratio_high:
        raise PlanError(f"rl_config.clip_ratio_low={rl_config.clip_ratio_low} must not exceed "
                        f"rl_config.clip_ratio_high={rl_config.clip_ratio_high} (clip_higher_enable)")
    if rl_config.overlong_buffer_enable:
        max_tokens = generate_config.sampling_config["max_tokens"]
        buffer = rl_config.overlong_buffer
        if isinstance(buffer, bool) or not isinstance(buffer, int) or not 0 < buffer < max_tokens:
            raise PlanError(f"rl_config.overlong_buffer={buffer!r} must be a positive int below "
                            f"sampling_config.max_tokens={max_tokens} (overlong_buffer_enable)")
        if rl_config.rollout_max_tokens != max_tokens:
            raise PlanError(f"rl_config.rollout_max_tokens={rl_config.rollout_max_tokens} must equal "
                            f"sampling_config.max_tokens={max_tokens} (overlong_buffer_enable)")
        overlong = OverlongSpec(buffer, float(rl_config.overlong_buffer_penalty_factor), max_tokens)
    train_prompts = None
    if rl_config.filter_groups_enable:
        metric = rl_config.filter_groups_metric
        if metric not in rl_config.verifier_function:
            raise PlanError(f"rl_config.filter_groups_metric={metric!r} must be one of "
                            f"rl_config.verifier_function={list(rl_config.verifier_function)}")
        train_prompts = rl_config.filter_groups_train_batch_size
        if isinstance(train_prompts, bool) or not isinstance(train_prompts, int) or train_prompts <= 0:
            raise PlanError(f"rl_config.filter_groups_train_batch_size={train_prompts!r} must be a positive int")
        max_batches = rl_config.filter_groups_max_batches
        if isinstance(max_batches, bool) or not isinstance(max_batches, int):
            raise PlanError(f"rl_config.filter_groups_max_batches={max_batches!r} must be an int (<= 0: no limit)")
        group_filter = GroupFilterSpec(metric, train_prompts, max_batches)
    return overlong, group_filter, train_prompts


def _balance(actor_config, rl_config) -> Optional[BalanceSpec]:
    if not rl_config.use_dp_batch_balance:
        return None
    workload = None
    if rl_config.dp_balance_objective == "flops":
        workload = WorkloadModel.from_megatron_config(actor_config)
    return BalanceSpec(rl_config.dp_balance_objective, rl_config.dp_balance_method, workload)


def features(rl_config, spec: WorkerSpec, train_rows: int, correction: CorrectionSpec = CorrectionSpec(),
             partial: Optional[PartialSpec] = None, multi_turn: Optional[MultiTurnSpec] = None) -> Features:
    """What the run does, from the configs (``train_rows``: the rows the train stages take, build_run_plan's):
    the stage table's rows read it."""
    ppo = ADV_ESTIMATORS.meta(rl_config.adv_estimator).get("critic", False)
    kl_in_reward = ppo and bool(rl_config.use_kl_in_reward)
    return Features(dynamic_sampling=bool(rl_config.filter_groups_enable),
                    kl_in_loss=rl_config.init_kl_coef > 0 and not kl_in_reward, kl_in_reward=kl_in_reward,
                    on_policy=rl_config.mini_batch_size == train_rows and rl_config.epochs == 1, critic=ppo,
                    estimator=ADV_ESTIMATORS.canonical(rl_config.adv_estimator),
                    rollout_log_probs=spec.rollout.returns_log_probs,
                    rollout_correction=correction.on and not correction.bypass_mode,
                    bypass=correction.bypass_mode, partial_rollout=partial is not None,
                    multi_turn=multi_turn is not None)


def _long_tail(actor_config, rl_config, generate_config, spec: WorkerSpec, stale: bool = False):
    """(partial rollout spec, rollout correction spec, multi-turn spec, worker spec): the rollout backend returns
    its log-probs whenever the correction needs them (transformers generate too). ``stale``: an async mode samples
    with older weights than it trains, so the correction's token-level weights are on by default."""
    try:
        multi_turn = multi_turn_spec(rl_config, generate_config, rl_config.max_prompt_length,
                                     actor_config.tokenizer_name_or_path or "", spec.engine.trust_remote_code)
        partial = partial_spec(rl_config, generate_config, actor_config.global_batch_size, multi_turn)
        correction = correction_spec(rl_config.rollout_correction, partial is not None or stale)
    except ValueError as err:
        raise PlanError(str(err)) from None
    can_hand_off = spec.rollout.backend == "vllm" and rl_config.rollout_balance == "queue"
    if multi_turn is not None and multi_turn.routing is None:  # the default where the queue can hand turns off
        multi_turn = dataclasses.replace(multi_turn, routing=DEFAULT_ROUTING if can_hand_off else STICKY)
    if multi_turn is not None and multi_turn.routing == FREE and not can_hand_off:
        raise PlanError(f"rl_config.multi_turn_routing='free' hands a conversation's next turn to another vLLM engine "
                        f"through the rollout queue; this run "
                        + ("uses transformers generate, which runs a take's turns together (set "
                           "generate_config.rollout_backend=vllm, or multi_turn_routing=sticky)"
                           if spec.rollout.backend != "vllm" else
                           "serves fixed shares (rl_config.rollout_balance=static, upstream's guarantee_order=true): set "
                           "rollout_balance=queue, or "
                           "multi_turn_routing=sticky"))
    if correction.on:
        if spec.rollout.logprobs is None:
            raise PlanError("rl_config.rollout_correction needs the rollout engine's log-probs: set "
                            "generate_config.sampling_config.logprobs (0 or more)")
        spec = dataclasses.replace(spec, rollout=dataclasses.replace(spec.rollout, hf_log_probs=True))
    return partial, correction, multi_turn, spec


def _check_async(schedule: Optional[AsyncSpec], layout: Layout, partial) -> None:
    """What the async modes do not run yet, in one line each."""
    if schedule is None:
        return
    key = f"rl_config.trainer_mode={schedule.mode}"
    if layout.tp > 1:
        raise PlanError(f"{key} runs one whole model per rollout engine: tensor parallelism "
                        f"(tensor_model_parallel_size={layout.tp}) is not implemented for its engines yet")
    if schedule.drop_stale and partial is None:
        raise PlanError("rl_config.drop_stale_rows acts on partial rollout's carried rows (partial_rollout_max_split "
                        "> 1); whole batches are at most max_staleness versions old by the schedule (DAPO's refills "
                        "are counted in async/over_bound_rows, not dropped): leave it out")
    if partial is not None and partial.budget_key != MAX_TOKENS_KEY:
        raise PlanError(f"{key} with partial rollout of multi-turn conversations (multi_turn_enable with "
                        f"partial_rollout_max_split > 1) is not implemented yet: the engines' passes carry single-turn "
                        f"rows only; set one of them")
    if partial is not None and partial.async_engine:
        raise PlanError(f"{key} with rl_config.async_engine=true is not implemented: a pass stops on the groups the "
                        f"pool completes, which the passes in flight beside it change; leave async_engine false (the "
                        f"pool's passes already cut rows at pass_tokens and continue them with newer weights)")



def _check_estimator(actor_config, rl_config):
    ppo = actor_config.stage == "ray_ppo"
    try:
        critic = ADV_ESTIMATORS.meta(rl_config.adv_estimator).get("critic", False)
    except ValueError as err:
        raise PlanError(str(err)) from None
    if ppo and not critic:
        raise PlanError(f"rl_config.adv_estimator={rl_config.adv_estimator!r} with megatron_training.stage=ray_ppo: "
                        f"PPO trains a critic for GAE; set adv_estimator: gae")
    if not ppo and critic:
        raise PlanError(f"rl_config.adv_estimator={rl_config.adv_estimator!r} needs a critic: use it with "
                        f"megatron_training.stage=ray_ppo, or an estimator without one (group_norm, rloo, "
                        f"reinforce_plus_plus, reinforce_plus_plus_baseline)")
    if not isinstance(rl_config.norm_adv_by_std_in_grpo, bool):
        raise PlanError(f"rl_config.norm_adv_by_std_in_grpo={rl_config.norm_adv_by_std_in_grpo!r} must be true or "
                        f"false")
    if ppo and rl_config.filter_groups_enable:
        raise PlanError("rl_config.filter_groups_enable (DAPO dynamic sampling) is not implemented with "
                        "megatron_training.stage=ray_ppo")
    if rl_config.use_kl_in_reward and not ppo:
        raise PlanError("rl_config.use_kl_in_reward=true is read by PPO only (megatron_training.stage=ray_ppo); "
                        "GRPO and DAPO take the KL in the loss (init_kl_coef)")
    for key in ("gamma", "lam", "cliprange_value") if ppo else ("gamma",):
        value = getattr(rl_config, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= (
                1 if key != "cliprange_value" else float("inf")):
            bound = "in [0, 1]" if key != "cliprange_value" else ">= 0"
            raise PlanError(f"rl_config.{key}={value!r} must be a number {bound}")


def _critic(critic_config, rl_config, generate_config, mini, rows) -> Optional[RolePlan]:
    """The critic group's layout and worker spec (critic_config on rl_config.critic_resource)."""
    if critic_config is None:
        raise PlanError("megatron_training.stage=ray_ppo needs a critic_config section (the critic's model, "
                        "layout and optimizer)")
    if rl_config.critic_resource is None:
        raise PlanError("megatron_training.stage=ray_ppo needs rl_config.critic_resource.num_npus (the critic's "
                        "devices)")
    layout = _check_layout(critic_config, rl_config.critic_resource, "critic_config", "critic_resource")
    if mini % layout.dp:
        raise PlanError(f"rl_config.mini_batch_size={mini} (in samples) must be divisible by the critic's data "
                        f"parallel size {layout.dp}")
    if not rl_config.use_dynamic_bsz and (mini // layout.dp) % critic_config.micro_batch_size:
        raise PlanError(f"rl_config.mini_batch_size // critic data parallel size = {mini // layout.dp} must be "
                        f"divisible by critic_config.micro_batch_size={critic_config.micro_batch_size}")
    _check_update_dispatch(rl_config.critic_update_dispatch_size, layout, critic_config, mini, rows,
                           key="critic_update_dispatch_size")
    return RolePlan(layout, worker_spec(critic_config, rl_config, generate_config, section="critic_config"))


def build_run_plan(actor_config, rl_config, generate_config, critic_config=None) -> RunPlan:
    """Derive the run plan (configs already checked by ``check_rl_args``): the stage table's rows
    whose ``when`` holds for the run's features, each sized for its role's layout."""
    _check_rollout_layout(actor_config, generate_config)
    layout = _check_layout(actor_config, rl_config.actor_resource, given_dp=generate_config.data_parallel_size)
    _check_estimator(actor_config, rl_config)
    spec = worker_spec(actor_config, rl_config, generate_config)
    dp = layout.dp
    overlong, group_filter, train_prompts = _dapo(rl_config, generate_config)
    rollout_rows = actor_config.global_batch_size * rl_config.n_samples_per_prompt
    # the train stages take filter_groups_train_batch_size prompts under dynamic sampling
    rows = (train_prompts or actor_config.global_batch_size) * rl_config.n_samples_per_prompt
    mini, n = rl_config.mini_batch_size, rl_config.n_samples_per_prompt
    if mini % n:
        raise PlanError(f"rl_config.mini_batch_size={mini} (in samples) must be a multiple of "
                        f"rl_config.n_samples_per_prompt={n}")
    if rows % mini:
        raise PlanError(f"rl_config.mini_batch_size={mini // n} prompts ({mini} samples with n_samples_per_prompt="
                        f"{n}) must divide the train batch of {rows // n} prompts ({rows} samples: global_batch_size, "
                        f"or filter_groups_train_batch_size with filter_groups_enable)")
    if mini % dp:
        raise PlanError(f"rl_config.mini_batch_size={mini} (in samples) must be divisible by the "
                        f"data parallel size {dp}")
    if not rl_config.use_dynamic_bsz and (mini // dp) % actor_config.micro_batch_size:
        raise PlanError(f"rl_config.mini_batch_size // data parallel size = {mini // dp} must be "
                        f"divisible by micro_batch_size={actor_config.micro_batch_size}")
    try:
        schedule = async_spec(rl_config)
    except ValueError as err:
        raise PlanError(str(err)) from None
    partial, correction, multi_turn, spec = _long_tail(actor_config, rl_config, generate_config, spec,
                                                       schedule is not None)
    _check_async(schedule, layout, partial)
    feats = features(rl_config, spec, rows, correction, partial, multi_turn)
    critic = _critic(critic_config, rl_config, generate_config, mini, rows) if feats.critic else None
    _check_update_dispatch(rl_config.actor_update_dispatch_size, layout, actor_config, mini, rows)
    layouts = {"actor": layout, "ref": layout, "critic": critic.layout if critic else None}
    stages: Dict[str, StagePlan] = {}
    for row in table.STAGES:
        if not row.when(feats):
            continue
        written = {c for s in stages.values() for c in s.outputs}
        inputs = row.inputs_for(feats) + tuple(c for c in row.optional_inputs if c in written)
        outputs = row.outputs_for(feats)
        n = rollout_rows if row.phase == "rollout" else rows
        if not row.is_dp:
            stages[row.name] = StagePlan(row.name, n, 1, False, stage=row, inputs=inputs,
                                         extra_outputs=outputs[len(row.outputs):])
            continue
        if layouts.get(row.role) is None:
            raise PlanError(f"stage '{row.name}' runs on role {row.role!r}, which has no worker group in this run "
                            f"(groups: {[r for r, v in layouts.items() if v is not None]})")
        role_dp = layouts[row.role].dp
        if row.share == "mini":  # one share per optimizer step: mini-batch rows over the role's DP ranks
            stages[row.name] = _stage(row, None, mini // role_dp, n, role_dp, rl_config.use_dp_batch_balance,
                                      inputs, outputs)
        else:
            size = getattr(rl_config, row.dispatch_key) if row.dispatch_key else None
            stages[row.name] = _stage(row, size, n // role_dp, n, role_dp,
                                      rl_config.use_dp_batch_balance, inputs, outputs,
                                      queued=rl_config.rollout_balance == "queue")
    if group_filter is not None:  # the filter reads its metric and carries what the train stages read
        later = [s for s in stages.values() if s.phase == "train"]
        made = {c for s in later for c in s.outputs}
        carried = tuple(dict.fromkeys(c for s in later for c in s.inputs if c not in made))
        stages[table.FILTER.name] = dataclasses.replace(stages[table.FILTER.name],
                                                        inputs=table.FILTER.inputs + carried)
    advantage = AdvantageSpec(float(rl_config.gamma), float(rl_config.lam), feats.kl_in_reward, rl_config.kl_penalty,
                              name=feats.estimator, norm_adv_by_std_in_grpo=rl_config.norm_adv_by_std_in_grpo,
                              critic=feats.critic)
    timeout = rl_config.td_timeout
    stage_timeout = float(getattr(rl_config, "stage_timeout", None) or timeout)
    return RunPlan(layout=layout, prompts_per_round=actor_config.global_batch_size,
                   n_samples=rl_config.n_samples_per_prompt, mini_batch_rows=mini, epochs=rl_config.epochs,
                   train_iters=actor_config.train_iters, stages=stages,
                   balance=_balance(actor_config, rl_config), seed=rl_config.seed,
                   train_prompts_per_round=train_prompts, overlong=overlong, group_filter=group_filter,
                   worker=spec, placement=rl_config.placement_strategy, features=feats, critic=critic, advantage=advantage,
                   partial=partial, correction=correction, multi_turn=multi_turn, trainer_mode=rl_config.trainer_mode,
                   asynchronous=schedule,
                   # a rank waits in a collective at most as long as its peers' stage runs: the driver's
                   # stage deadline fires first and names the rank that did not answer
                   timeouts=Timeouts(td_timeout=timeout, collective=max(timeout, stage_timeout) + 60.0,
                                     placement=timeout, stage=stage_timeout))
