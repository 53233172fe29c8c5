"""The stage table's driver rows as plain functions ``fn(trainer, stage) -> metrics``, registered by the
name the row gives (``Stage.method``). A new driver stage is a function here (or anywhere imported before
the run) and a row in plan/stages.py; ``check_stage_functions`` finds a missing one before Ray starts."""
from typing import Dict, Mapping

import torch

from mindspeed_rl.algorithms import DRIVER_STAGES, get_adv_estimator_fn, register_stage
from mindspeed_rl.algorithms.gae import model_token_rewards, token_level_rewards
from mindspeed_rl.algorithms.masked import masked_mean, pad_rows
from mindspeed_rl.plan.stages import LOSS_MASK
from mindspeed_rl.trainer.utils import correction_stage, ppo_stages
from mindspeed_rl.data.columnar import unpadded_rows
from mindspeed_rl.data.driver_dock import put_columns
from mindspeed_rl.trainer.utils.reward_stage import advantage_stats, compute_rewards as reward_stage


def compute_rewards(trainer, stage) -> Dict[str, float]:
    """Rule rewards (and DAPO's overlong penalty, filter metric) and data metrics of the round."""
    plan = trainer.run_plan
    metrics = reward_stage(trainer.transfer_dock, stage, trainer.reward_list, overlong=plan.overlong,
                           filter_metric=plan.group_filter.metric if plan.group_filter else None)
    trainer.reward_guard.check(trainer.iteration, trainer.reward_list)  # stops before training on failed rewards
    return metrics


def compute_advantage(trainer, stage) -> Dict[str, float]:
    """The run's estimator (rl_config.adv_estimator) on the round: per-token advantages (and returns when the
    row writes them); the token rewards are compute_kl's when it ran, else each row's score on its last token."""
    td, plan = trainer.transfer_dock, trainer.run_plan
    spec = plan.advantage
    rows = list(range(stage.rows_per_share))
    batch = td.get_rows(list(stage.inputs), rows)
    lengths = torch.tensor([int(x) for x in batch["response_length"]])
    if "token_level_rewards" in batch:
        rewards, mask = pad_rows([t.float() for t in batch["token_level_rewards"]])
    else:
        scores = torch.cat([s.reshape(1).float() for s in batch["rm_scores"]])
        rewards, mask = token_level_rewards(scores, lengths)
    if LOSS_MASK in batch:  # multi-turn: GAE runs over the model's tokens; the score moves to the last of them
        model, _ = pad_rows([m.float().reshape(-1) for m in batch[LOSS_MASK]])
        rewards, mask = model_token_rewards(rewards, mask, model[:, :rewards.shape[1]])
    values = pad_rows([t.float() for t in batch["values"]])[0] if "values" in batch else None
    advantages, returns = get_adv_estimator_fn(spec.name)(rewards, mask, plan.n_samples, spec, values=values)
    out = (unpadded_rows(advantages, lengths), unpadded_rows(returns, lengths))  # the round's tokens, one tensor
    put_columns(td, dict(zip(stage.outputs, out)), rows)
    metrics = advantage_stats(out[0][0])
    if values is not None:
        metrics.update({"critic/returns_mean": masked_mean(returns, mask).item(),
                        "critic/values_mean": masked_mean(values, mask).item()})
    trainer.reward_guard.check_advantages(trainer.iteration, metrics)  # says when every advantage is 0
    return metrics


def compute_rollout_correction(trainer, stage) -> Dict[str, float]:
    """IS weights and rejection between the old log-probs and the rollout engine's (rl_config.rollout_correction)."""
    spec = trainer.run_plan.correction
    metrics = correction_stage.compute_rollout_correction(trainer.transfer_dock, stage, spec)
    trainer.rejection_guard.check(trainer.iteration, metrics, spec)  # stops before training on no token
    return metrics


def compute_kl_rewards(trainer, stage) -> Dict[str, float]:
    """PPO use_kl_in_reward: per-token rewards less kl_coef * KL(old || ref)."""
    return ppo_stages.compute_kl_rewards(trainer.transfer_dock, stage, trainer.kl_ctrl.value,
                                         trainer.run_plan.advantage.kl_penalty)


def check_stage_functions(plan, worker_classes: Mapping[str, type]) -> None:
    """Every row the plan keeps has its function: a registered driver function, or the method on the worker
    class of its role (``worker_classes``: role -> class; 'ref' runs on the actor's). ValueError naming the row."""
    for stage in plan.stages.values():
        if not stage.is_dp:
            if stage.method not in DRIVER_STAGES:
                raise ValueError(f"stage '{stage.name}' of the run plan names driver function {stage.method!r}, "
                                 f"which is not registered (known: {DRIVER_STAGES.names()})")
            continue
        cls = worker_classes.get("actor" if stage.role == "ref" else stage.role)
        methods = [stage.method] + ([stage.stage.queue_method] if stage.queued else [])
        for method in methods:
            if cls is None or not callable(getattr(cls, method, None)):
                raise ValueError(f"stage '{stage.name}' of the run plan runs {method!r} on role {stage.role!r}, "
                                 f"which its worker class {getattr(cls, '__name__', None)} does not have")


# registered by name (plain calls rather than decorators: the functions stay plain module functions)
register_stage("compute_rewards")(compute_rewards)
register_stage("compute_advantage")(compute_advantage)
register_stage("compute_rollout_correction")(compute_rollout_correction)
register_stage("compute_kl_rewards")(compute_kl_rewards)
