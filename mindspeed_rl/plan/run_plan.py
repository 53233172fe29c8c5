"""The run plan: every number of a run's layout, derived once from the configs.

The launcher, workers, trainer and transfer dock all take this one object; none of them re-derives a layout, a
row count or a dispatch size. The types are in plan_types, the layout checks in layout, the checks spanning
several keys in feature_checks.
"""
import dataclasses
from typing import Dict, Optional

from mindspeed_rl.algorithms.spec import AdvantageSpec
from mindspeed_rl.plan import stages as table
from mindspeed_rl.plan.feature_checks import (balance_spec, check_async, check_estimator, dapo_specs, features,
                                             long_tail_specs)
from mindspeed_rl.plan.layout import check_layout, check_rollout_layout, check_update_dispatch
from mindspeed_rl.plan.plan_types import (  # noqa: F401  (the plan's types, imported from here by callers)
    FOLDED, SUPPORTED_LAYOUTS, BalanceSpec, GroupFilterSpec, Layout, OverlongSpec, PlanError, RolePlan, RunPlan,
    StagePlan, Timeouts)
from mindspeed_rl.plan.stages import BALANCED_STAGES, Features, Stage  # noqa: F401  (re-exported)
from mindspeed_rl.plan.trainer_mode import async_spec
from mindspeed_rl.plan.worker_spec import worker_spec


def sized_stage(stage: Stage, size, default, rows, dp, balanced, inputs, outputs, queued=False) -> StagePlan:
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


def critic_role(critic_config, rl_config, generate_config, mini, rows) -> Optional[RolePlan]:
    """The critic group's layout and worker spec (critic_config on rl_config.critic_resource)."""
    if critic_config is None:
        raise PlanError("megatron_training.stage=ray_ppo needs a critic_config section (the critic's model, "
                        "layout and optimizer)")
    if rl_config.critic_resource is None:
        raise PlanError("megatron_training.stage=ray_ppo needs rl_config.critic_resource.num_npus (the critic's "
                        "devices)")
    layout = check_layout(critic_config, rl_config.critic_resource, "critic_config", "critic_resource")
    if mini % layout.dp:
        raise PlanError(f"rl_config.mini_batch_size={mini} (in samples) must be divisible by the critic's data "
                        f"parallel size {layout.dp}")
    if not rl_config.use_dynamic_bsz and (mini // layout.dp) % critic_config.micro_batch_size:
        raise PlanError(f"rl_config.mini_batch_size // critic data parallel size = {mini // layout.dp} must be "
                        f"divisible by critic_config.micro_batch_size={critic_config.micro_batch_size}")
    check_update_dispatch(rl_config.critic_update_dispatch_size, layout, critic_config, mini, rows,
                           key="critic_update_dispatch_size")
    return RolePlan(layout, worker_spec(critic_config, rl_config, generate_config, section="critic_config"))


def build_run_plan(actor_config, rl_config, generate_config, critic_config=None) -> RunPlan:
    """Derive the run plan (configs already checked by ``check_rl_args``): the stage table's rows
    whose ``when`` holds for the run's features, each sized for its role's layout."""
    check_rollout_layout(actor_config, generate_config)
    layout = check_layout(actor_config, rl_config.actor_resource, given_dp=generate_config.data_parallel_size)
    check_estimator(actor_config, rl_config)
    spec = worker_spec(actor_config, rl_config, generate_config)
    dp = layout.dp
    overlong, group_filter, train_prompts = dapo_specs(rl_config, generate_config, spec.loss.loss_mode)
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
    partial, correction, multi_turn, spec = long_tail_specs(actor_config, rl_config, generate_config, spec,
                                                       schedule is not None)
    check_async(schedule, layout, partial)
    feats = features(rl_config, spec, rows, correction, partial, multi_turn)
    critic = critic_role(critic_config, rl_config, generate_config, mini, rows) if feats.critic else None
    check_update_dispatch(rl_config.actor_update_dispatch_size, layout, actor_config, mini, rows)
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
            stages[row.name] = sized_stage(row, None, mini // role_dp, n, role_dp, rl_config.use_dp_batch_balance,
                                      inputs, outputs)
        else:
            size = getattr(rl_config, row.dispatch_key) if row.dispatch_key else None
            stages[row.name] = sized_stage(row, size, n // role_dp, n, role_dp,
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
                   balance=balance_spec(actor_config, rl_config), seed=rl_config.seed,
                   train_prompts_per_round=train_prompts, overlong=overlong, group_filter=group_filter,
                   worker=spec, placement=rl_config.placement_strategy, features=feats, critic=critic, advantage=advantage,
                   partial=partial, correction=correction, multi_turn=multi_turn, trainer_mode=rl_config.trainer_mode,
                   asynchronous=schedule,
                   # a rank waits in a collective at most as long as its peers' stage runs: the driver's
                   # stage deadline fires first and names the rank that did not answer
                   timeouts=Timeouts(td_timeout=timeout, collective=max(timeout, stage_timeout) + 60.0,
                                     placement=timeout, stage=stage_timeout))
