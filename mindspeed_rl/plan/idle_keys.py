"""Keys set to something that does nothing, or not what it seems, in the run's setting: one line each (a
``warning:`` in the run, a ``note:`` in ``--dry-run``), read from the run plan that decided the setting."""
from typing import List


def idle_key_lines(rl_config, plan) -> List[str]:
    """What each key of ``rl_config`` that has no effect under ``plan`` would have done, and why it does not."""
    lines = []
    loss = plan.worker.loss
    if rl_config.loss_scale_factor is not None and loss.agg_mode != "seq-mean-token-sum-norm":
        lines.append(f"rl_config.loss_scale_factor={rl_config.loss_scale_factor} has no effect: it is the length "
                     f"that loss_agg_mode seq-mean-token-sum-norm divides by, and this run aggregates with "
                     f"{loss.agg_mode}")
    if rl_config.norm_adv_by_std_in_grpo is False and plan.features.estimator != "group_norm":
        lines.append(f"rl_config.norm_adv_by_std_in_grpo=false has no effect: only adv_estimator group_norm (grpo) "
                     f"divides by the group's std, and this run's estimator is {plan.features.estimator}")
    if rl_config.async_engine is True and plan.partial is None:
        lines.append("rl_config.async_engine=true has no effect: it stops partial rollout's passes early, and "
                     "partial rollout is off (rl_config.partial_rollout_max_split=1; set it above 1, as upstream "
                     "pairs the two)")
    if rl_config.critic_resource is not None and plan.critic is None:
        lines.append("rl_config.critic_resource has no effect: it places PPO's critic group, and this run trains no "
                     "critic (megatron_training.stage is not ray_ppo)")
    rollout = plan.worker.rollout
    if rollout.backend == "vllm" and rollout.max_num_seqs == 1:
        lines.append("generate_config.max_num_seqs=1 with the vLLM backend: each engine runs one request at a time, "
                     "so its rows are decoded one after another with no batching and it takes one row at a time from "
                     "the rollout queue; raise it (e.g. to the rows an engine takes per iteration) to batch rows "
                     "within an engine")
    return lines
