"""The checks that span several keys, by feature: DAPO's keys, the advantage estimator and the critic, the long-tail
features (partial rollout, rollout correction, multi-turn) and the async modes; ``features`` says what the run does
(the stage table's rows read it)."""
import dataclasses
from typing import Optional

from mindspeed_rl.algorithms import ADV_ESTIMATORS
from mindspeed_rl.balance.workload import WorkloadModel
from mindspeed_rl.plan.multi_turn import DEFAULT_ROUTING, FREE, STICKY, MultiTurnSpec, multi_turn_spec
from mindspeed_rl.plan.partial_rollout import MAX_TOKENS_KEY, PartialSpec, partial_spec
from mindspeed_rl.plan.plan_types import BalanceSpec, GroupFilterSpec, Layout, OverlongSpec, PlanError
from mindspeed_rl.plan.rollout_correction import CorrectionSpec, correction_spec
from mindspeed_rl.plan.stages import Features
from mindspeed_rl.plan.trainer_mode import AsyncSpec
from mindspeed_rl.plan.worker_spec import WorkerSpec


def dapo_specs(rl_config, generate_config, loss_mode: str = "vanilla"):
    """(overlong spec, group filter spec, train prompts) of the DAPO keys, checked as upstream does; ``loss_mode``:
    the worker spec's policy loss (checked there)."""
    overlong = group_filter = None
    # DAPO's clip-higher bounds (CISPO and GSPO may bound the ratio below more loosely than above)
    if loss_mode == "vanilla" and rl_config.clip_higher_enable and rl_config.clip_ratio_low > rl_config.clip_ratio_high:
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


def balance_spec(actor_config, rl_config) -> Optional[BalanceSpec]:
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


def long_tail_specs(actor_config, rl_config, generate_config, spec: WorkerSpec, stale: bool = False):
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
        raise PlanError("rl_config.multi_turn_routing='free' hands a conversation's next turn to another vLLM engine "
                        "through the rollout queue; this run "
                        + ("uses transformers generate, which runs a take's turns together (set "
                           "generate_config.rollout_backend=vllm, or multi_turn_routing=sticky)"
                           if spec.rollout.backend != "vllm" else
                           "serves fixed shares (rl_config.rollout_balance=static, upstream's "
                           "guarantee_order=true): set rollout_balance=queue, or multi_turn_routing=sticky"))
    if correction.on:
        if spec.rollout.logprobs is None:
            raise PlanError("rl_config.rollout_correction needs the rollout engine's log-probs: set "
                            "generate_config.sampling_config.logprobs (0 or more)")
        spec = dataclasses.replace(spec, rollout=dataclasses.replace(spec.rollout, hf_log_probs=True))
    return partial, correction, multi_turn, spec


def check_async(schedule: Optional[AsyncSpec], layout: Layout, partial) -> None:
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



def check_estimator(actor_config, rl_config):
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
