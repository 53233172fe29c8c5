"""StageTableTrainer: one iteration runs the run plan's stage table in order (rollout -> rewards and
advantages -> ref/old log-probs (-> critic values, GAE, critic update) -> actor update), for every algorithm:
which rows run is the plan's, what a driver row does is its registered function (trainer/driver_stages.py).
Dynamic sampling (DAPO) and partial rollout repeat the rollout rows (trainer/dynamic_sampling.py,
trainer/partial_rollout.py). The dock lives in the driver; trainer/stage_runner.py runs the stages on it.
Upstream's RayGRPOTrainer, RayDAPOTrainer and RayPPOTrainer are this class under their names."""
import math
import time
from typing import Dict, Iterator, List

import numpy as np
from tqdm import tqdm

from mindspeed_rl.balance.rollout_figures import rollout_note
from mindspeed_rl.plan.algorithm_line import algorithm_record
from mindspeed_rl.plan.stages import BALANCED_STAGES, ROLLOUT, TRAIN
from mindspeed_rl.trainer import driver_stages, dynamic_sampling, partial_rollout  # noqa: F401  (registers)
from mindspeed_rl.trainer.modes import mode_step
from mindspeed_rl.trainer.stage_runner import StageRunner
from mindspeed_rl.algorithms.kl import AdaptiveKLController, FixedKLController
from mindspeed_rl.trainer.utils.reward_guard import RejectionGuard, RewardGuard
from mindspeed_rl.agent.metrics import turn_metrics, turn_summary
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.utils.checkpoint import Checkpointer
from mindspeed_rl.utils.loggers import MetricsLogger
from mindspeed_rl.utils.metrics import balance_key, plan_balance_metrics, rank_balance_metrics


def rank_timing_metrics(results: List[Dict[str, float]]) -> Dict[str, float]:
    """Per-rank stage times, tokens and (on CUDA) peak memory from the workers,
    plus max/min over ranks (the step waits for the slowest rank)."""
    out = {}
    for key in sorted({k for r in results for k in r if k.startswith(("timing/", "tokens/", "memory/"))}):
        values = [r[key] for r in results if key in r]
        for r in results:
            if key in r:
                out[f"{key}/rank{int(r['rank'])}"] = r[key]
        out[f"{key}/max"], out[f"{key}/min"] = max(values), min(values)
    return out


class CheckpointSaveError(RuntimeError):
    """A save failed (the tracker still names the previous checkpoint)."""


class NonFiniteError(RuntimeError):
    """Too many iterations in a row with a non-finite reward, loss or grad norm."""


# in causal order: a NaN reward makes the loss NaN, which makes the grad norm NaN; a NaN critic (PPO, trained
# before the actor) makes the values, hence the advantages and the actor's loss NaN
NONFINITE_KEYS = ("reward/mean", "critic/vf_loss", "critic/grad_norm", "actor/pg_loss", "actor/kl",
                  "actor/entropy", "actor/grad_norm")
# the engines whose skipped optimizer steps (``<engine>/skipped_steps``, cumulative) count as non-finite
ENGINES = ("critic", "actor")


def skipped_steps(metrics: Dict[str, float], before: Dict[str, float]) -> Dict[str, float]:
    """Each engine's cumulative skipped optimizer steps after an iteration (``before`` where not reported)."""
    return {e: metrics.get(f"{e}/skipped_steps", before.get(e, 0.0)) for e in ENGINES}


def first_nonfinite(metrics: Dict[str, float], skipped_before=None):
    """The first non-finite quantity of an iteration's metrics, in words (None when all are finite):
    rewards (``reward/nonfinite`` rows, counted by the rewards stage), loss, grad norm, or an optimizer
    step an engine skipped (its ``<engine>/skipped_steps`` grew since ``skipped_before``: a dict by engine, or
    the actor's count)."""
    if not isinstance(skipped_before, dict):
        skipped_before = {"actor": skipped_before or 0.0}
    rows = metrics.get("reward/nonfinite", 0)
    if rows:
        first = metrics.get("reward/first_nonfinite_row")
        return (f"reward in {int(rows)} rows" + (f" (first row {int(first)}" if first is not None else "")
                + (f", score {metrics['reward/first_nonfinite_value']})"
                   if "reward/first_nonfinite_value" in metrics else ")" if first is not None else ""))
    for key in NONFINITE_KEYS:
        value = metrics.get(key)
        if value is not None and not math.isfinite(value):
            return f"{key}={value}"
    for engine in ENGINES:
        grown = metrics.get(f"{engine}/skipped_steps")
        before = skipped_before.get(engine) or 0
        if grown is not None and grown > before:
            name = "" if engine == "actor" else f"{engine} "
            return f"{name}grad norm (the engine skipped {grown - before:g} optimizer step(s))"
    return None


def async_summary(m: Dict[str, float]) -> str:
    """The console line's async part ('' under sync): the rows' staleness, the engines' weight version, how long
    the trainer waited for rollout."""
    if "async/staleness_max" not in m:
        return ""
    return (f" async: staleness={m['async/staleness_mean']:.2f}/{int(m['async/staleness_max'])} "
            f"weights=v{int(m['async/weight_version'])} trainer_wait={m['async/trainer_wait_s']:.2f}s")


def verifier_fault_lines(iteration: int, metrics: Dict[str, float]) -> List[str]:
    """One console line per iteration naming the verifiers that timed out or raised
    (``reward/<verifier>/timeouts`` and ``/errors`` of VerifierReward.last_metrics)."""
    parts = []
    for key in sorted(k for k in metrics if k.startswith("reward/") and k.endswith("/timeouts")):
        name = key[len("reward/"):-len("/timeouts")]
        timeouts, errors = metrics.get(key, 0), metrics.get(f"reward/{name}/errors", 0)
        if timeouts or errors:
            parts.append(f"{name}: {int(timeouts)} timed out, {int(errors)} raised")
    for key in sorted(k for k in metrics if k.startswith("reward/") and k.endswith("/errors")):
        name = key[len("reward/"):-len("/errors")]
        if f"reward/{name}/timeouts" not in metrics and metrics[key]:
            parts.append(f"{name}: {int(metrics[key])} raised")
    if not parts:
        return []
    return [f"iter {iteration}: verifier faults (scored 0): " + "; ".join(parts)]


class StageTableTrainer:
    """Runs on the driver; runs the stage table, never per-rank work. Row counts, stages and the algorithm's
    settings come from ``run_plan`` (config_cls.RunPlan); ``critic_worker``: PPO's critic group;
    ``rollout_worker``: the async modes' rollout engines."""
    pipeline = None  # the async modes' RolloutPipeline (trainer/modes/pipeline.py); None under sync

    def __init__(self, actor_worker=None, ref_worker=None, reward_list=None, logger: MetricsLogger = None,
                 train_iters: int = None, max_prompt_length: int = None, max_nonfinite_iterations: int = 3,
                 max_failed_reward_iterations: int = 1, run_plan=None, critic_worker=None,
                 kl_ctrl_type: str = "fixed", kl_horizon: int = 1000, kl_target: float = 100.0,
                 init_kl_coef: float = 0.001, dataset_additional_keys: List[str] = None, save_interval: int = 0,
                 save_dir: str = None, save_optimizer: bool = True, save_rng: bool = True,
                 data_position: int = None, eos_id: int = None, max_all_rejected_iterations: int = 1,
                 run_identity: dict = None, algorithm: dict = None, rollout_worker=None):
        if run_plan is None:
            raise ValueError("the trainer needs the run_plan (config_cls.RunPlan) of the run")
        # the worker group of each role of the stage table
        self.groups = {"actor": actor_worker, "ref": ref_worker or actor_worker, "critic": critic_worker,
                       "rollout": rollout_worker}
        for stage in run_plan.dp_stages:
            if self.groups.get(stage.role) is None:
                raise ValueError(f"stage '{stage.name}' of the run plan runs on role {stage.role!r}, but no worker "
                                 f"group was given for it (groups: "
                                 f"{sorted(k for k, v in self.groups.items() if v is not None)})")
        self.run_plan, self.reward_list = run_plan, reward_list or []
        self.dataset_additional_keys = dataset_additional_keys or []
        self.save_interval, self.save_dir = save_interval, save_dir
        self.save_optimizer, self.save_rng = save_optimizer, save_rng
        if kl_ctrl_type == "fixed":
            self.kl_ctrl = FixedKLController(init_kl_coef)
        elif kl_ctrl_type == "adaptive":
            self.kl_ctrl = AdaptiveKLController(init_kl_coef, kl_target, kl_horizon)
        else:
            raise ValueError(f"kl_ctrl_type must be 'fixed' or 'adaptive', got {kl_ctrl_type!r}")
        # data_position: prompt batches taken from the data iterator so far (None: one per iteration)
        self.data_position = data_position
        self.max_nonfinite_iterations = max_nonfinite_iterations
        self.reward_guard, self.iteration = RewardGuard(max_failed_reward_iterations), 0
        self.rejection_guard = RejectionGuard(max_all_rejected_iterations)
        self.last_saved = None
        self.logger = logger or MetricsLogger()
        self.train_iters = train_iters if train_iters is not None else self.run_plan.train_iters
        self.max_prompt_length = max_prompt_length
        self.history: List[Dict[str, float]] = []
        self.transfer_dock_init()
        # partial rollout: prompts in flight between iterations (eos_id: a row that ends in it is complete),
        # and the rollout passes run so far
        self.carry_pool = (partial_rollout.make_pool(self.run_plan, eos_id, self.dataset_additional_keys)
                           if self.run_plan.partial is not None else None)
        self.rollout_passes = 0
        # what ties the pool to this run (data_path, tokenizer: partial_rollout.pool_identity's keywords)
        self.pool_identity = (partial_rollout.pool_identity(self.run_plan, **(run_identity or {}))
                              if self.carry_pool is not None else None)
        # the async modes: the rollout engines' pipeline (batches ahead, the buffer, weight versions)
        self.pipeline = None
        if self.run_plan.asynchronous is not None:
            if rollout_worker is None:
                raise ValueError(f"rl_config.trainer_mode={self.run_plan.trainer_mode} needs the rollout engine "
                                 f"group (rollout_worker)")
            from mindspeed_rl.trainer.modes.pool_pipeline import make_pipeline
            self.pipeline = make_pipeline(self, rollout_worker, self.run_plan.asynchronous)
        # the algorithm each checkpoint records (plan.algorithm_line.algorithm_record)
        self.algorithm = algorithm if algorithm is not None else algorithm_record(self.run_plan, None)

    def transfer_dock_init(self):
        plan = self.run_plan
        # a rollout batch, DAPO's train batch or partial rollout's pool, whichever is largest
        self.transfer_dock = DriverDock(plan.dock_prompts, plan.n_samples,
                                        addition_columns=self.dataset_additional_keys, run_plan=plan)

    def fit(self, data_iters: Iterator[dict], start_iteration: int = 0, kl_coef: float = None) -> List[Dict[str, float]]:
        """Iterations ``start_iteration + 1 .. train_iters`` (a resumed run passes
        the checkpoint's iteration and KL coefficient; the data iterator is
        already positioned). An iteration with a non-finite reward, loss or
        grad norm is never checkpointed; ``max_nonfinite_iterations`` of them
        in a row stop the run (NonFiniteError)."""
        if kl_coef is not None:
            self.kl_ctrl.value = kl_coef
        self.data_iter = data_iters  # partial rollout and dynamic sampling take more batches inside an iteration
        self.transfer_dock.set_round(start_iteration)
        bar = tqdm(range(start_iteration + 1, self.train_iters + 1), desc="GRPO", disable=None)
        self.last_saved = start_iteration if start_iteration else None
        streak: List[tuple] = []  # (iteration, what) of the current run of non-finite iterations
        owed = False  # a save fell on a non-finite iteration: the next finite one saves
        skipped: Dict[str, float] = {}
        pipeline = self.pipeline
        if pipeline is not None and pipeline.state_ref is None:  # no pipeline state was loaded
            pipeline.launched = pipeline.taken = int(self.data_position or 0)
            pipeline.push(self.groups["actor"].policy_state_ref(), start_iteration)
        for iteration in bar:
            metrics = self.step(iteration, next(data_iters))
            self.history.append(metrics)
            self.logger.log(iteration, metrics, self._summary(iteration, metrics))
            for line in verifier_fault_lines(iteration, metrics):
                print(line, flush=True)
            bar.set_postfix(reward=f"{metrics.get('reward/mean', float('nan')):.3f}")
            bad = first_nonfinite(metrics, skipped)
            skipped = skipped_steps(metrics, skipped)
            due = self.save_interval and iteration % self.save_interval == 0
            due = bool(self.save_dir) and (due or owed or iteration == self.train_iters)
            if bad is None:
                streak = []
                if due:
                    self.save(iteration)
                    owed = False
                continue
            streak.append((iteration, bad))
            owed = owed or due
            limit = self.max_nonfinite_iterations
            print(f"warning: iteration {iteration}: non-finite {bad}; its optimizer steps were skipped"
                  + ("; no checkpoint is written from it" if self.save_dir else "")
                  + (f" ({len(streak)} of {limit} in a row allowed)" if limit else ""), flush=True)
            if limit and len(streak) >= limit:
                saved = (f"the last checkpoint is iteration {self.last_saved} in {self.save_dir}"
                         if self.last_saved is not None and self.save_dir else "no checkpoint was written")
                raise NonFiniteError(
                    f"{len(streak)} iterations in a row ({streak[0][0]}-{iteration}) had non-finite values "
                    f"(rl_config.max_nonfinite_iterations={limit}); the first: iteration {streak[0][0]}: "
                    f"{streak[0][1]}; {saved}")
        return self.history

    def step(self, iteration: int, batch: dict) -> Dict[str, float]:
        """One iteration, as the run's trainer mode runs it (trainer/modes; sync: the run plan's stages in order).
        A DP stage is the dock's plan and rows, one call per rank, and one write of the results; a driver stage
        is one fetch and one put."""
        return mode_step(self.run_plan.trainer_mode)(self, iteration, batch)

    def took_batch(self, iteration: int):
        self.iteration = iteration
        if self.data_position is None:
            self.data_position = iteration - 1
        self.data_position += 1

    def run_stages(self, stages, iteration: int):
        """Run ``stages`` (StagePlans) in order on the dock's current round (trainer/stage_runner.py); returns
        (driver stages' metrics, the ranks' metrics of the DP stages). Consecutive DP stages on one worker
        group whose plans coincide (the reference and old log-probs) run in one call per rank."""
        runner = StageRunner(self.transfer_dock, self.groups)
        return runner.run(stages, self, iteration=iteration, kl_coef=self._loss_kl_coef())

    def _loss_kl_coef(self) -> float:
        """The actor loss's KL coefficient: none unless the plan puts the KL in the loss (not with init_kl_coef 0,
        nor when PPO's use_kl_in_reward takes it from the rewards)."""
        return self.kl_ctrl.value if self.run_plan.features.kl_in_loss else 0.0

    def finish_step(self, iteration: int, metrics: Dict[str, float], results: List[Dict[str, float]],
                     start: float):
        """Update metrics, per-rank timings and balance, the dock's round summary; KL control."""
        td, plan = self.transfer_dock, self.run_plan
        for stage in plan.dp_stages:  # the update stages' engine metrics (actor/*, critic/*), mean over ranks
            ran = [r for r in results if f"timing/{stage.name}" in r]
            if stage.method == "update" and ran:
                metrics.update({k: float(np.mean([u[k] for u in ran])) for k in ran[0]
                                if k.startswith(f"{stage.role}/")})
        metrics.update(rank_timing_metrics(results))
        metrics.update(rank_balance_metrics(results))
        metrics.update(turn_metrics(results))  # multi-turn rollouts: the ranks' tool counts as per-row rates
        summary = td.round_summary()
        metrics.update(summary["metrics"])
        metrics.update(plan_balance_metrics(summary["balance"]))  # per DP rank, as the balance report
        self.logger.log_balance(iteration, summary["balance"])
        metrics["timing/iteration"] = time.perf_counter() - start
        kl = metrics.get("actor/reward_kl" if plan.features.kl_in_reward else "actor/kl", 0.0)
        self.kl_ctrl.update(kl, plan.train_rows_per_round)
        return metrics

    def load_state_dict(self, state: Dict[str, float]) -> None:
        """The driver state of ``state_dict`` back (a resumed run's trainer_state.json, or a fresh run's
        iteration 0): the data position, the iteration, and the KL coefficient where it was saved."""
        if "kl_coef" in state:
            self.kl_ctrl.value = float(state["kl_coef"])
        self.data_position = int(state["data_position"])
        self.iteration = int(state["iteration"])
        self.last_saved = self.iteration or None

    def state_dict(self, iteration: int) -> Dict[str, float]:
        """Driver state after ``iteration``: the KL coefficient, the data iterator's position (batches taken; the
        dock's round follows from it) and the algorithm trained (a resume that changes it says so)."""
        position = iteration if self.data_position is None else self.data_position
        return {"iteration": iteration, "kl_coef": self.kl_ctrl.value, "data_position": position,
                "algorithm": dict(self.algorithm)}

    def save(self, iteration: int) -> str:
        """Checkpoint after ``iteration`` (see utils.checkpoint.Checkpointer)."""
        start = time.perf_counter()
        checkpointer = Checkpointer(self.save_dir, self._save_groups)
        try:
            folder = checkpointer.save(iteration, self.state_dict(iteration))
        except Exception as err:  # noqa: BLE001  (one line; the tracker was not touched)
            from mindspeed_rl.utils.error_cause import brief
            before = (f"iteration {self.last_saved}" if self.last_saved is not None else "no iteration")
            raise CheckpointSaveError(f"saving iteration {iteration} into {self.save_dir!r} failed: {brief(err)}; "
                                      f"the checkpoint tracker still names {before}") from err
        self.last_saved = iteration
        print(f"saved checkpoint {folder} in {time.perf_counter() - start:.2f}s", flush=True)
        return folder

    def _save_groups(self, folder: str) -> None:
        for role in self.run_plan.roles:  # every worker group writes its own state into the iteration folder
            self.groups[role].save_checkpoint(folder, self.save_optimizer, self.save_rng)
        if self.carry_pool is not None:
            partial_rollout.save_pool(self, folder)
        if self.pipeline is not None:
            from mindspeed_rl.trainer.modes.pipeline import save_pipeline
            save_pipeline(self, folder, self.iteration)

    def load_driver_state(self, folder: str) -> None:
        """The driver's own state of checkpoint ``folder`` beyond trainer_state.json: the partial rollout pool,
        the async modes' pipeline (batches made ahead, the engines' weights)."""
        if self.pipeline is not None:
            from mindspeed_rl.trainer.modes.pipeline import load_pipeline
            buffered = load_pipeline(self, folder)
            if buffered is not None:
                made = "partial rollout pass(es) in flight" if self.carry_pool is not None else "batch(es) made ahead"
                print(f"{self.run_plan.trainer_mode}: continuing {buffered} {made} in {folder}", flush=True)
        if self.carry_pool is not None:
            rows = partial_rollout.load_pool(self, folder)
            if rows:
                print(f"partial rollout: continuing {rows} rows of {folder}'s pool", flush=True)
        else:
            line = partial_rollout.dropped_pool_line(folder)
            if line:
                print(line, flush=True)

    def checked(self, batch: dict) -> dict:
        """Reject prompts longer than ``max_prompt_length`` (naming the row)."""
        limit = self.max_prompt_length
        if limit:
            for row, prompt in enumerate(batch["prompts"]):
                if prompt.numel() > limit:
                    raise ValueError(f"prompt {row} of the batch has {prompt.numel()} tokens, "
                                     f"more than rl_config.max_prompt_length={limit}")
        return batch

    @staticmethod
    def _summary(iteration: int, m: Dict[str, float]) -> str:
        def get(key, fmt="{:.3f}"):
            return fmt.format(m[key]) if key in m else "-"
        def planned(stage):  # a planned stage's loads; one row per rank leaves the planner nothing to choose
            if m.get(balance_key(stage, "rows_per_rank_max"), 2.0) <= 1:
                return f"{stage}: nothing to balance (1 row per rank)"
            return (f"{stage}:imb={get(balance_key(stage, 'rank_imbalance'), '{:.2%}')}"
                    f"(random {get(balance_key(stage, 'rank_imbalance_random'), '{:.2%}')})")
        balance = " ".join(planned(stage) for stage in BALANCED_STAGES if balance_key(stage, "rank_imbalance") in m)
        if balance_key(ROLLOUT.name, "bound_gap") in m:  # the queued rollout: its engines' busy times
            note = rollout_note(m, ROLLOUT.name)  # one take per engine, or too short: its imbalance is no signal
            balance = (f"{ROLLOUT.name}: {note} " if note else
                       f"{ROLLOUT.name}:imb={get(balance_key(ROLLOUT.name, 'rank_imbalance'), '{:.2%}')}"
                       f"(static {get(balance_key(ROLLOUT.name, 'rank_imbalance_random'), '{:.2%}')}) "
                       f"bound+{get(balance_key(ROLLOUT.name, 'bound_gap'), '{:.1%}')} ") + balance
        return (f"iter {iteration}: reward={get('reward/mean')} resp_len={get('response_length/mean', '{:.2f}')} "
                f"loss={get('actor/pg_loss', '{:.4f}')} kl={get('actor/kl', '{:.4f}')} "
                f"update max/min rank s={get(f'timing/{TRAIN.name}/max', '{:.2f}')}/"
                f"{get(f'timing/{TRAIN.name}/min', '{:.2f}')} "
                f"{balance}" + dynamic_sampling.summary(m) + turn_summary(m) + async_summary(m))
