"""The run's algorithm in one line, for the console and the dry run: which trainer runs
(``megatron_training.stage``) and the features of it that this run switches on or off."""
from typing import Optional

from mindspeed_rl.algorithms import ADV_ESTIMATORS, POLICY_LOSSES

ALGORITHMS = {None: "GRPO", "ray_grpo": "GRPO", "ray_dapo": "DAPO", "ray_ppo": "PPO"}


def algorithm_name(plan, stage: Optional[str]) -> str:
    """GRPO, DAPO or PPO by the stage; a registered estimator or loss with a title of its own (or Dr.GRPO's
    switches) named instead of GRPO, or after DAPO: 'DAPO + RLOO'."""
    f, loss = plan.features, plan.worker.loss
    names = [] if ALGORITHMS[stage] == "GRPO" else [ALGORITHMS[stage]]
    estimator = ADV_ESTIMATORS.meta(f.estimator).get("title")
    if estimator:
        names.append(estimator)
    elif f.estimator == "group_norm" and not plan.advantage.norm_adv_by_std_in_grpo:
        names.append("Dr.GRPO")
    names += [t for t in (POLICY_LOSSES.meta(loss.loss_mode).get("title"),) if t]
    return " + ".join(names) or "GRPO"


def algorithm_line(plan, stage: Optional[str]) -> str:
    """``algorithm: DAPO (megatron_training.stage=ray_dapo): ...`` from the run plan, whose features were
    decided once from the configs (nothing here reads a config)."""
    name = ALGORITHMS[stage]
    f, loss = plan.features, plan.worker.loss
    parts = []
    if f.critic:
        critic = plan.critic.layout
        parts.append(f"critic DP={critic.dp} TP={critic.tp}, GAE gamma={plan.gae.gamma:g} lam={plan.gae.lam:g}, "
                     f"value clip {loss.cliprange_value:g}")
    else:
        scaled = "" if f.estimator != "group_norm" or plan.advantage.norm_adv_by_std_in_grpo else " without std (Dr.GRPO)"
        parts.append(f"advantages {f.estimator}{scaled} over {plan.n_samples} samples per prompt")
    if name == "DAPO" or f.dynamic_sampling:
        g = plan.group_filter
        if g is None:
            parts.append("dynamic sampling off (filter_groups_enable: false)")
        else:
            limit = f"at most {g.max_batches} batches" if g.max_batches > 0 else "no batch limit"
            parts.append(f"dynamic sampling on '{g.metric}' (keeps {g.train_prompts} groups, {limit})")
    if plan.overlong is not None:
        o = plan.overlong
        parts.append(f"overlong penalty over the last {o.buffer} of {o.max_tokens} tokens (factor {o.penalty_factor:g})")
    elif name == "DAPO":
        parts.append("overlong penalty off")
    if loss.clip_ratio_low is not None:
        parts.append(f"clip-higher ({loss.clip_ratio_low:g}, {loss.clip_ratio_high:g})")
    else:
        parts.append(f"clip {loss.clip_ratio:g}")
    if loss.loss_mode != "vanilla":
        parts.append(f"policy loss {loss.loss_mode}")
    words = {"token-mean": "token-level loss", "seq-mean-token-mean": "sequence-mean loss",
             "seq-mean-token-sum": "loss seq-mean-token-sum",
             "seq-mean-token-sum-norm": f"loss seq-mean-token-sum-norm over {loss.horizon:g} tokens"}
    parts.append(words[loss.agg_mode])
    if f.kl_in_reward:
        parts.append(f"KL in the rewards ({loss.kl_penalty})")
    elif f.kl_in_loss:
        parts.append(f"KL in the loss ({loss.kl_penalty})")
    else:
        parts.append("no KL (init_kl_coef 0)")
    parts.append("on-policy (one optimizer step per round)" if f.on_policy
                 else f"{plan.steps_per_iteration} optimizer steps per round")
    return (f"algorithm: {algorithm_name(plan, stage)} (megatron_training.stage={stage or 'ray_grpo'}): "
            + "; ".join(parts))


def algorithm_record(plan, stage: Optional[str]) -> dict:
    """The algorithm a checkpoint was trained with, by the keys that choose it (saved in trainer_state.json)."""
    loss = plan.worker.loss
    return {"name": algorithm_name(plan, stage), "megatron_training.stage": stage or "ray_grpo",
            "rl_config.adv_estimator": plan.features.estimator,
            "rl_config.norm_adv_by_std_in_grpo": plan.advantage.norm_adv_by_std_in_grpo,
            "rl_config.loss_mode": loss.loss_mode, "rl_config.loss_agg_mode": loss.agg_mode}


def algorithm_change_line(saved: Optional[dict], now: dict, folder: str, iteration: int) -> Optional[str]:
    """The warning of a resume that trains another algorithm than its checkpoint's (None: the same, or a
    checkpoint that does not record it)."""
    if not isinstance(saved, dict):
        return None
    changed = [f"{key} {saved[key]!r} -> {value!r}" for key, value in now.items()
               if key != "name" and key in saved and saved[key] != value]
    if not changed:
        return None
    return (f"warning: checkpoint {folder} (iteration {iteration}) was trained as {saved.get('name', '?')}; this run "
            f"continues it as {now['name']}: {', '.join(changed)} (weights, optimizer state, KL coefficient and data "
            f"position carry over)")
