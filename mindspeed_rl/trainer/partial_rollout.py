"""One iteration with partial rollout (``rl_config.partial_rollout_max_split > 1``; config_cls/partial_rollout.py).

The pool (trainer/utils/carry_pool.py) is topped up with prompt batches while a whole batch fits; rollout passes
run over its incomplete rows (each a round of the dock on the rollout queue, every row at most ``pass_tokens``
new tokens) until ``global_batch_size`` prompts are complete; those become the train round and every other stage
of the table runs on it as usual. The pool is saved beside the workers' state in every checkpoint.
"""
import os
import time
from typing import Dict

import torch

from mindspeed_rl.config_cls.stages import ROLLOUT, ROLLOUT_LOG_PROBS
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics, sum_by_rank
from mindspeed_rl.trainer.utils.carry_pool import CarryPool

POOL_FILE = "carry_pool.pt"


def make_pool(plan, eos_id, extra_columns) -> CarryPool:
    spec = plan.partial
    return CarryPool(plan.n_samples, spec.max_tokens, spec.pass_tokens, eos_id, extra_columns)


def step(trainer, iteration: int, batch: dict) -> Dict[str, float]:
    plan, pool, td = trainer.run_plan, trainer.carry_pool, trainer.transfer_dock
    spec = plan.partial
    start = time.perf_counter()
    trainer.took_batch(iteration)
    pool.add(trainer.checked(batch))
    while pool.groups + spec.train_prompts <= spec.pool_prompts:  # room for a whole batch: take the next
        before = pool.groups
        pool.add(trainer.checked(next(trainer.data_iter)))
        trainer.data_position += 1
        if pool.groups == before:
            raise ValueError(f"partial rollout: prompt batch {trainer.data_position} holds no prompts")
    rollout = [plan.stage(ROLLOUT.name)]
    outputs = [c for c in rollout[0].outputs]
    passes, unserved, rollout_metrics, rollout_results = 0, 0, [], []
    while len(pool.complete_groups()) < spec.train_prompts:
        rows = pool.pass_rows()
        if not rows:  # every row is complete and still too few prompts: the batches were short
            raise RuntimeError(f"partial rollout: the pool holds {pool.groups} prompts, all complete, fewer than the "
                               f"{spec.train_prompts} an iteration trains (global_batch_size); the prompt batches "
                               f"were smaller than global_batch_size")
        trainer.rollout_passes += 1
        passes += 1
        td.set_round(2 * trainer.rollout_passes)  # rounds (and the pass's sampling seeds) follow the pass count
        td.clear()
        td.put_experience(pool.pass_inputs(rows), list(range(len(rows))))
        td.set_queue_groups(*pool.pass_groups(rows), stop=pool.stop_rule(rows, spec) if spec.async_engine else None)
        metrics, results = trainer.run_stages(rollout, iteration=trainer.rollout_passes)
        rollout_metrics.append(metrics)
        rollout_results += results
        served = td.rows_with("responses")  # all of them, unless async_engine stopped the pass early
        made = td.get_rows(outputs, served)
        pool.extend([rows[i] for i in served], list(made["responses"]),
                    list(made[ROLLOUT_LOG_PROBS]) if ROLLOUT_LOG_PROBS in made else None, iteration)
        unserved += len(rows) - len(served)
    columns, partial_metrics = pool.take(spec.train_prompts, iteration)
    if ROLLOUT_LOG_PROBS not in td.experience_columns:
        columns.pop(ROLLOUT_LOG_PROBS)
    td.set_round(2 * trainer.rollout_passes + 1)
    td.clear()
    td.put_experience(columns, list(range(len(columns["prompts"]))))
    train = [s for s in plan.stages.values() if s.name != ROLLOUT.name]
    metrics, results = trainer.run_stages(train, iteration=iteration)
    metrics.update(merge_rollout_metrics(rollout_metrics))
    metrics.update(partial_metrics)
    metrics["partial_rollout/passes"] = float(passes)
    if spec.async_engine:
        metrics["partial_rollout/rows_left_in_queue"] = float(unserved)
    return trainer.finish_step(iteration, metrics, sum_by_rank(rollout_results) + results, start)


def save_pool(trainer, folder: str) -> None:
    state = dict(trainer.carry_pool.state_dict(), rollout_passes=trainer.rollout_passes)
    try:
        torch.save(state, os.path.join(folder, POOL_FILE))
    except Exception as err:  # noqa: BLE001  (one line naming the folder; the save is abandoned)
        raise RuntimeError(f"saving the partial rollout pool into {folder!r} failed: {type(err).__name__}: "
                           f"{err}") from err


def has_pool(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, POOL_FILE))


def load_pool(trainer, folder: str) -> int:
    """Continue the rows of ``folder``'s pool; returns how many rows it held. A checkpoint without a pool (saved
    with partial rollout off) starts an empty one."""
    path = os.path.join(folder, POOL_FILE)
    if not os.path.exists(path):
        return 0
    try:
        state = torch.load(path, weights_only=True)  # plain tensors, ints and lists
    except Exception as err:  # noqa: BLE001  (a damaged file, named)
        raise ValueError(f"partial rollout: cannot read {path}: {type(err).__name__}: {err}") from None
    trainer.carry_pool.load_state_dict(state)
    trainer.rollout_passes = int(state["rollout_passes"])
    return len(trainer.carry_pool.rows)
