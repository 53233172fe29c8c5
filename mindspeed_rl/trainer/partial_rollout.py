"""Partial rollout (``rl_config.partial_rollout_max_split > 1``; plan/partial_rollout.py): a row part of the
trainer modes (trainer/modes).

The pool (trainer/utils/carry_pool.py) is topped up with prompt batches while a whole batch fits; rollout passes
run over its incomplete rows (each a round of the dock on the rollout queue, every row at most ``pass_tokens``
new tokens) until ``global_batch_size`` prompts are complete; those become a round of their own (``PoolRounds``),
which the mode trains on (or filters first, with dynamic sampling). The pool is saved beside the workers' state in
every checkpoint.
"""
import os
from typing import Dict, List, Optional

import torch

from mindspeed_rl.plan.stages import ROLLOUT, ROLLOUT_LOG_PROBS
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics
from mindspeed_rl.trainer.utils.carry_pool import CarryPool, is_int, state_problem
from mindspeed_rl.trainer.utils.carried_turns import PASS_COLUMNS
from mindspeed_rl.utils.tokenizer import tokenizer_digest

POOL_FILE = "carry_pool.pt"


def make_pool(plan, eos_id, extra_columns) -> CarryPool:
    spec = plan.partial
    return CarryPool(plan.n_samples, spec.max_tokens, spec.pass_tokens, eos_id, extra_columns,
                     turns=plan.multi_turn is not None)


class PoolRounds:
    """Rounds of complete groups from the carry pool, one per ``next_round``: the pool is topped up with prompt
    batches while a whole batch fits (the iteration's own batch first), rollout passes run over its incomplete
    rows until ``train_prompts`` groups are complete, and the oldest of them go on the dock as a round of their
    own. The passes' metrics and rank results gather here (``metrics()``, ``results``)."""

    def __init__(self, trainer, iteration: int, batch: dict):
        self.trainer, self.iteration, self.first = trainer, iteration, batch
        self.results, self.passes, self.unserved = [], 0, 0
        self._pass_metrics, self._takes, self._after = [], [], []
        trainer.took_batch(iteration)

    @property
    def seed_iteration(self) -> int:
        """The iteration number the rounds' driver stages run under: the pass count."""
        return self.trainer.rollout_passes

    def next_round(self) -> None:
        trainer, pool, td = self.trainer, self.trainer.carry_pool, self.trainer.transfer_dock
        plan = trainer.run_plan
        spec = plan.partial
        if self.first is not None:
            pool.add(trainer.checked(self.first))
            self.first = None
        while pool.groups + spec.train_prompts <= spec.pool_prompts:  # room for a whole batch: take the next
            before = pool.groups
            pool.add(trainer.checked(next(trainer.data_iter)))
            trainer.data_position += 1
            if pool.groups == before:
                raise ValueError(f"partial rollout: prompt batch {trainer.data_position} holds no prompts")
        rollout = [plan.stage(ROLLOUT.name)]
        outputs = list(rollout[0].outputs)
        while len(pool.complete_groups()) < spec.train_prompts:
            rows = pool.pass_rows()
            if not rows:  # every row is complete and still too few prompts: the batches were short
                raise RuntimeError(f"partial rollout: the pool holds {pool.groups} prompts, all complete, fewer than "
                                   f"the {spec.train_prompts} an iteration trains (global_batch_size); the prompt "
                                   f"batches were smaller than global_batch_size")
            trainer.rollout_passes += 1
            self.passes += 1
            td.set_round(2 * trainer.rollout_passes)  # rounds (and the pass's sampling seeds) follow the pass count
            td.clear()
            td.put_experience(pool.pass_inputs(rows), list(range(len(rows))))
            td.set_queue_groups(*pool.pass_groups(rows),
                                stop=pool.stop_rule(rows, spec) if spec.async_engine else None)
            metrics, results = trainer.run_stages(rollout, iteration=trainer.rollout_passes)
            self._pass_metrics.append(metrics)
            self.results += results
            served = td.rows_with("responses")  # all of them, unless async_engine stopped the pass early
            made = td.get_rows(outputs, served)
            pool.extend([rows[i] for i in served], list(made["responses"]),
                        list(made[ROLLOUT_LOG_PROBS]) if ROLLOUT_LOG_PROBS in made else None, self.iteration,
                        {c: list(made[c]) for c in PASS_COLUMNS} if pool.turns else None)
            self.unserved += len(rows) - len(served)
        columns, take_metrics = pool.take(spec.train_prompts, self.iteration)
        self._takes.append(take_metrics)
        if ROLLOUT_LOG_PROBS not in td.experience_columns:
            columns.pop(ROLLOUT_LOG_PROBS)
        td.set_round(self.train_round)
        td.clear()
        td.put_experience(columns, list(range(len(columns["prompts"]))))

    @property
    def train_round(self) -> int:
        return 2 * self.trainer.rollout_passes + 1

    def record(self, metrics: Dict[str, float], results) -> None:
        """What the stages run on the latest take reported (dynamic sampling's rewards and filter)."""
        self._after.append(metrics)
        self.results += results

    def metrics(self) -> Dict[str, float]:
        """The passes' rollout metrics merged, the takes' pool metrics, the pass count."""
        out = merge_rollout_metrics(self._pass_metrics)
        out.update(merge_rollout_metrics(self._after))
        out.update(merge_takes(self._takes))
        out["partial_rollout/passes"] = float(self.passes)
        if self.trainer.run_plan.partial.async_engine:
            out["partial_rollout/rows_left_in_queue"] = float(self.unserved)
        return out


def merge_takes(takes: List[Dict[str, float]]) -> Dict[str, float]:
    """The pool metrics of several takes in one iteration (dynamic sampling): counts add up, maxima are the
    largest, the mean age is the takes' mean (equal takes), what is left in the pool is the last take's."""
    if len(takes) == 1:
        return dict(takes[0])
    out = {}
    for key in takes[-1]:
        values = [t[key] for t in takes]
        out[key] = (sum(values) if key.endswith(("continued_rows", "continued_tokens")) else
                    max(values) if key.endswith(("_max", "max_passes")) else
                    sum(values) / len(values) if key.endswith("_mean") else values[-1])
    return out


def pool_identity(plan, data_path: Optional[str] = None, tokenizer=None) -> Dict[str, object]:
    """What ties a pool to its run, by the key that sets each: the seed, data and tokenizer its prompts were drawn
    and tokenized with, the batch and group sizes, the pass budget its rows were cut by, and whether its rows are
    conversations (the tokenizer as utils.tokenizer.tokenizer_digest)."""
    spec = plan.partial
    identity: Dict[str, object] = {
        "rl_config.seed": plan.seed, "megatron_training.global_batch_size": plan.prompts_per_round,
        "rl_config.n_samples_per_prompt": plan.n_samples, "rl_config.partial_rollout_max_split": spec.max_split,
        spec.budget_key: spec.max_tokens, "rl_config.multi_turn_enable": plan.multi_turn is not None}
    if data_path is not None:
        identity["megatron_training.data_path"] = os.path.normpath(str(data_path))
    if tokenizer is not None:
        identity["tokenizer"] = tokenizer_digest(tokenizer)
    return identity


def save_pool(trainer, folder: str) -> None:
    state = dict(trainer.carry_pool.state_dict(), rollout_passes=trainer.rollout_passes, run=trainer.pool_identity)
    try:
        torch.save(state, os.path.join(folder, POOL_FILE))
    except Exception as err:  # noqa: BLE001  (one line naming the folder; the save is abandoned)
        raise RuntimeError(f"saving the partial rollout pool into {folder!r} failed: {type(err).__name__}: "
                           f"{err}") from err


def has_pool(folder: str) -> bool:
    return os.path.exists(os.path.join(folder, POOL_FILE))


def read_pool(folder: str, identity: Optional[Dict[str, object]] = None) -> Optional[dict]:
    """The pool of checkpoint ``folder`` checked whole (None: it has none): ValueError naming the file on a file
    that does not load, any damage (carry_pool.state_problem), or, given this run's ``identity``, a pool of
    another run. A pool saved before pools recorded their run is continued with a warning."""
    path = os.path.join(folder, POOL_FILE)
    if not os.path.exists(path):
        return None
    try:
        state = torch.load(path, weights_only=True)  # plain tensors, ints and lists
    except Exception as err:  # noqa: BLE001  (a damaged file, named)
        raise ValueError(f"partial rollout: cannot read {path}: {type(err).__name__}: {err}") from None
    problem = state_problem(state)
    if problem is None and not is_int(state.get("rollout_passes")):
        problem = f"its 'rollout_passes' is {state.get('rollout_passes')!r}, not an int"
    if problem:
        raise ValueError(f"partial rollout: {path} is damaged: {problem}; nothing of it was continued (resume "
                         f"from another checkpoint, or remove the file to start with an empty pool)")
    if identity is None:
        return state
    saved = state.get("run")
    if not isinstance(saved, dict):
        print(f"warning: partial rollout: {path} does not record the run it belongs to (saved before pools "
              f"recorded it); its rows are continued unchecked", flush=True)
        return state
    changed = [f"its {key}={saved.get(key)!r}, this run's {value!r}" for key, value in identity.items()
               if key in saved and saved[key] != value]
    if changed:
        raise ValueError(f"partial rollout: {path} belongs to another run: {'; '.join(changed)}; continuing it "
                         f"would train that run's prompts and rows: resume with that run's settings, or remove the "
                         f"file to start with an empty pool")
    return state


def load_pool(trainer, folder: str) -> int:
    """Continue the rows of ``folder``'s pool (checked whole first, ``read_pool``); returns how many rows it held.
    A checkpoint without a pool (saved with partial rollout off) starts an empty one."""
    state = read_pool(folder, trainer.pool_identity)
    if state is None:
        return 0
    trainer.carry_pool.load_state_dict(state)
    trainer.rollout_passes = int(state["rollout_passes"])
    return len(trainer.carry_pool.rows)


def dropped_pool_line(folder: str) -> Optional[str]:
    """The warning of a resume with partial rollout off from a checkpoint whose pool holds rows (None: no pool,
    or an empty one): how many prompts, rows and tokens made so far are dropped."""
    state = read_pool(folder)
    if not state or not state["rows"]:
        return None
    rows = state["rows"]
    prompts = len({r["group"] for r in rows})
    tokens = sum(int(r["tokens"].numel()) for r in rows)
    return (f"warning: partial rollout is off (rl_config.partial_rollout_max_split=1): the pool of {folder} is "
            f"dropped: {prompts} prompts in flight, {len(rows)} rows, {tokens} tokens made so far; their prompts "
            f"are not drawn again")
