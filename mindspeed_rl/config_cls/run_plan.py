"""The run plan: every number of a run's layout, derived once from the configs.

The launcher, workers, trainer and transfer dock all take this one object;
none of them re-derives a layout, a row count or a dispatch size.
"""
import warnings
from dataclasses import dataclass, field
from typing import Dict, Optional

from mindspeed_rl.config_cls.rl_config import resource_size
from mindspeed_rl.utils.workload import WorkloadModel

# DP-consumed stages in the order an iteration runs them
ROLLOUT, REF, OLD, TRAIN = "actor_rollout", "ref_log_prob", "actor_log_prob", "actor_train"
# stages whose shares may be balanced by sequence workload
BALANCED_STAGES = (REF, OLD, TRAIN)
SUPPORTED_LAYOUTS = ("DP x TP with pipeline_model_parallel_size = 1 and context_parallel_size = 1")


class PlanError(ValueError):
    """The configs describe a run this implementation cannot carry out."""


ENGINES = ("ddp", "tp", "fsdp")


@dataclass(frozen=True)
class Layout:
    world_size: int  # worker processes (devices)
    dp: int
    tp: int
    # ddp: replicas; tp: DTensor TP weights, grads averaged over dp; fsdp: FSDP2 over dp (+ TP)
    engine: str = "ddp"


@dataclass(frozen=True)
class BalanceSpec:
    objective: str = "tokens"   # 'tokens' or 'flops'
    method: str = "auto"
    workload: Optional[WorkloadModel] = None  # set for 'flops'


@dataclass(frozen=True)
class StagePlan:
    """How the dock serves one DP-consumed stage: share s of a round's plan
    goes to DP rank s % dp; every rank takes ``shares_per_rank`` shares."""
    name: str
    rows_per_share: int
    shares_per_rank: int
    balanced: bool        # balanced by workload (else a seeded random split)
    unit: int = 1         # rows per unit: 1 = single samples, n = whole GRPO groups
    config_key: str = ""  # the key that sets rows_per_share, for messages


@dataclass(frozen=True)
class Timeouts:
    data_wait: float      # a stage waiting on the dock for its rows
    collective: float     # torch.distributed process-group timeout
    placement: float      # Ray placement group to become ready


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

    @property
    def rows_per_round(self) -> int:
        return self.prompts_per_round * self.n_samples

    @property
    def mini_batches(self) -> int:
        """Optimizer steps per epoch of one iteration."""
        return self.rows_per_round // self.mini_batch_rows

    @property
    def steps_per_iteration(self) -> int:
        return self.mini_batches * self.epochs

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps of the whole run (the LR schedule's length)."""
        return self.train_iters * self.steps_per_iteration

    @property
    def uses_reference(self) -> bool:
        return REF in self.stages

    @property
    def computes_old_log_prob(self) -> bool:
        return OLD in self.stages

    def stage(self, name: str) -> StagePlan:
        if name not in self.stages:
            raise KeyError(f"run plan has no stage '{name}'; it runs {list(self.stages)}")
        return self.stages[name]

    def summary(self) -> str:
        parts = [f"{s.name}: {s.shares_per_rank} x {s.rows_per_share} rows/rank"
                 f"{' balanced' if s.balanced else ''}" for s in self.stages.values()]
        return (f"layout DP={self.layout.dp} TP={self.layout.tp} ({self.layout.world_size} workers, "
                f"{self.layout.engine} engine); "
                f"{self.rows_per_round} rows per round; " + "; ".join(parts))


def _check_layout(actor_config, rl_config, generate_config) -> Layout:
    for key, value in (("pipeline_model_parallel_size", actor_config.pipeline_model_parallel_size),
                       ("context_parallel_size", actor_config.context_parallel_size),
                       ("expert_model_parallel_size", actor_config.expert_model_parallel_size)):
        if value != 1:
            raise PlanError(f"actor_config.{key}={value} is not implemented; supported layouts: "
                            f"{SUPPORTED_LAYOUTS}")
    if generate_config.infer_pipeline_parallel_size != 1:
        raise PlanError(f"generate_config.infer_pipeline_parallel_size="
                        f"{generate_config.infer_pipeline_parallel_size} is not implemented; rollout runs "
                        f"on the actor's layout ({SUPPORTED_LAYOUTS})")
    infer_tp = generate_config.infer_tensor_parallel_size
    if infer_tp != actor_config.tensor_model_parallel_size:
        warnings.warn(f"generate_config.infer_tensor_parallel_size={infer_tp} is not implemented: rollout runs "
                      f"on the actor's layout (tensor_model_parallel_size="
                      f"{actor_config.tensor_model_parallel_size})", UserWarning, stacklevel=2)
    given_dp = generate_config.data_parallel_size
    world = resource_size(rl_config.actor_resource)
    if world is None:
        raise PlanError("rl_config.actor_resource.num_npus is not set; the run plan needs the device count")
    tp = actor_config.tensor_model_parallel_size
    if tp < 1 or world % tp:
        raise PlanError(f"rl_config.actor_resource.num_npus={world} must be divisible by "
                        f"actor_config.tensor_model_parallel_size={tp}")
    dp = world // tp
    if given_dp not in (None, dp):
        raise PlanError(f"generate_config.data_parallel_size={given_dp} disagrees with the layout's data "
                        f"parallel size {dp}; leave it unset (it is derived)")
    _check_tp_divides_model(actor_config, tp)
    if actor_config.use_distributed_optimizer:
        if dp == 1:
            raise PlanError(f"megatron_training.use_distributed_optimizer=true shards over data parallel ranks, "
                            f"but the layout has DP=1 ({world} devices / TP {tp}); set it to false")
        engine = "fsdp"
    else:
        engine = "tp" if tp > 1 else "ddp"
    return Layout(world_size=world, dp=dp, tp=tp, engine=engine)


def _check_tp_divides_model(cfg, tp):
    """TP must split heads and KV heads evenly (checked again on the checkpoint by the engine)."""
    kv = cfg.num_query_groups if cfg.group_query_attention else cfg.num_attention_heads
    for key, value in (("num_attention_heads", cfg.num_attention_heads), ("num_query_groups", kv),
                       ("ffn_hidden_size", cfg.ffn_hidden_size)):
        if value is not None and value % tp:
            raise PlanError(f"actor_config.tensor_model_parallel_size={tp} does not divide the model's "
                            f"{key}={value}")


def _stage(name, key, size, default, rows, dp, balanced) -> StagePlan:
    size = default if size is None else size
    if size <= 0 or rows % size:
        raise PlanError(f"rl_config.{key}={size} must be a positive divisor of the "
                        f"{rows} rows of a round (global_batch_size * n_samples_per_prompt)")
    shares = rows // size
    if shares % dp:
        raise PlanError(f"rl_config.{key}={size} gives {shares} shares per round, not a multiple of the "
                        f"data parallel size {dp}: every DP rank must take the same number of shares")
    return StagePlan(name, size, shares // dp, balanced, config_key=key)


def _balance(actor_config, rl_config) -> Optional[BalanceSpec]:
    if not rl_config.use_dp_batch_balance:
        return None
    workload = None
    if rl_config.dp_balance_objective == "flops":
        workload = WorkloadModel.from_megatron_config(actor_config)
    return BalanceSpec(rl_config.dp_balance_objective, rl_config.dp_balance_method, workload)


def build_run_plan(actor_config, rl_config, generate_config) -> RunPlan:
    """Derive the run plan (configs already checked by ``validate_rl_args``)."""
    layout = _check_layout(actor_config, rl_config, generate_config)
    dp = layout.dp
    rows = actor_config.global_batch_size * rl_config.n_samples_per_prompt
    mini = rl_config.mini_batch_size
    if mini % dp:
        raise PlanError(f"rl_config.mini_batch_size={mini} (in samples) must be divisible by the "
                        f"data parallel size {dp}")
    if not rl_config.use_dynamic_bsz and (mini // dp) % actor_config.micro_batch_size:
        raise PlanError(f"rl_config.mini_batch_size // data parallel size = {mini // dp} must be "
                        f"divisible by micro_batch_size={actor_config.micro_batch_size}")
    balanced = rl_config.use_dp_batch_balance
    stages = {ROLLOUT: _stage(ROLLOUT, "actor_rollout_dispatch_size", rl_config.actor_rollout_dispatch_size,
                              rows // dp, rows, dp, False)}
    if rl_config.init_kl_coef > 0:
        stages[REF] = _stage(REF, "ref_dispatch_size", rl_config.ref_dispatch_size, rows // dp, rows, dp,
                             balanced)
    if not (mini == rows and rl_config.epochs == 1):  # on-policy: the update's own log-probs are the old ones
        stages[OLD] = _stage(OLD, "actor_logprob_dispatch_size", rl_config.actor_logprob_dispatch_size,
                             rows // dp, rows, dp, balanced)
    if rl_config.actor_update_dispatch_size not in (None, mini // dp):
        raise PlanError(f"rl_config.actor_update_dispatch_size={rl_config.actor_update_dispatch_size}: in "
                        f"integrated mode each rank trains on mini_batch_size // DP = {mini // dp} rows "
                        f"per optimizer step; leave it unset")
    stages[TRAIN] = _stage(TRAIN, "actor_update_dispatch_size", None, mini // dp, rows, dp, balanced)
    timeout = rl_config.td_timeout
    return RunPlan(layout=layout, prompts_per_round=actor_config.global_batch_size,
                   n_samples=rl_config.n_samples_per_prompt, mini_batch_rows=mini, epochs=rl_config.epochs,
                   train_iters=actor_config.train_iters, stages=stages,
                   balance=_balance(actor_config, rl_config), seed=rl_config.seed,
                   timeouts=Timeouts(data_wait=timeout, collective=timeout + 60.0, placement=timeout))
