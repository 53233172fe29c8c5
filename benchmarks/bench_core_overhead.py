"""Non-compute CPU per GRPO iteration: driver + dock + Ray, on the tiny config.

The real trainer, dock, launcher, workers and rollout queue run on a local Ray with DP=2;
only the model engine is replaced by a stand-in that does (almost) no
arithmetic, so the CPU seconds every process of the run spends per iteration
(driver with its dock, worker actors; user + system, all threads) are the cost
of moving data and commands between the stages. Each block runs ``--iters``
iterations after a warm-up; the table gives the median and min-max over
``--repeats`` blocks and the script exits 1 when the median misses the target.

    python benchmarks/bench_core_overhead.py [--iters 10] [--repeats 5] [--target 0.05] [--quick]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

CONFIG = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")


class StandInEngine:
    """The engine interface with no model: fixed-length responses, zero log-probs."""

    def __init__(self, *args, **kwargs):
        pass

    def generate(self, prompts, max_new_tokens, seed=0, **kwargs):
        import torch
        rng = np.random.default_rng((seed or 0) % 2 ** 32)
        return [torch.ones(int(rng.integers(1, max_new_tokens + 1)), dtype=torch.int32) for _ in prompts]  # as the engine: int32 ids

    def log_probs(self, prompts, responses, micro_batches, temperature=1.0, **kwargs):
        import torch
        return [torch.zeros(r.numel()) for r in responses], None

    def train_step(self, prompts, responses, micro_batches, loss_fn, token_count, **kwargs):
        return {"actor/pg_loss": 0.0, "actor/kl": 0.0, "actor/grad_norm": 1.0}

    def set_step(self, steps):
        pass


def _worker_class():
    from mindspeed_rl.models.rollout.hf_backend import HFRollout
    from mindspeed_rl.workers.integrated_worker import IntegratedWorker

    class StandInWorker(IntegratedWorker):
        def initialize(self, model_path, eos_id, pad_id):
            self.actor = StandInEngine()
            self.ref = StandInEngine() if self.run_plan.uses_reference else None
            self.rollout = HFRollout(self.actor)  # generate on the stand-in engine
            self.eos_id, self.pad_id = eos_id, pad_id
            return self.rank

    return StandInWorker


def _cpu(pids):
    """CPU seconds (user + system) of each process."""
    import psutil
    return np.array([sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids])


def _reward(responses, labels):
    import torch
    return torch.tensor([min(1.0, r.numel() / 8) for r in responses])


def measure(iters: int, repeats: int, warmup: int = 3):
    import ray
    from mindspeed_rl.plan.loader import build_configs, load_config
    from mindspeed_rl.datasets.prompt_dataset import prompt_batches
    from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
    from mindspeed_rl.utils.loggers import MetricsLogger
    from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray
    from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

    total = warmup + iters * repeats
    cfgs = build_configs(load_config(CONFIG, ["megatron_training.model_path=/unused",
                                              f"megatron_training.train_iters={total}"]))
    actor, rl, plan = cfgs.actor_config, cfgs.rl_config, cfgs.plan
    data = prompt_batches(actor.data_path, actor.global_batch_size, rl.seed, None)
    started = init_ray(num_cpus=2)
    group = None
    try:
        group = RayActorGroup(_worker_class(), plan)
        group.initialize("/unused", 13, 14)
        with tempfile.TemporaryDirectory() as out:
            logger = MetricsLogger(out)
            trainer = RayGRPOTrainer(actor_worker=group, reward_list=[_reward], run_plan=plan, logger=logger,
                                     init_kl_coef=rl.init_kl_coef, dataset_additional_keys=["labels"])
            pids = [os.getpid()]  # the driver, which holds the dock
            pids += ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in group.actors])
            done = warmup
            trainer.train_iters = done
            _quiet(trainer.fit, data)
            if group.queue is not None:  # the rollout queue's actor (made by the first round) counts too
                pids.append(ray.get(group.queue.__ray_call__.remote(lambda self: os.getpid())))
            per_iter, wall = [], []
            for _ in range(repeats):
                cpu0, t0 = _cpu(pids), time.perf_counter()
                trainer.train_iters = done + iters
                _quiet(trainer.fit, data, start_iteration=done)
                per_iter.append((_cpu(pids) - cpu0) / iters)  # driver (with its dock), worker ranks, queue
                wall.append((time.perf_counter() - t0) / iters)
                done += iters
            logger.close()
        return np.array(per_iter), np.array(wall), len(group.actors)
    finally:
        if group is not None:
            group.shutdown()
        if started:
            shutdown_ray()


def _quiet(fn, *args, **kwargs):
    """Run without the per-iteration console lines."""
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args, **kwargs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.05, help="CPU-s per iteration the median must not exceed")
    parser.add_argument("--quick", action="store_true", help="2 blocks of 4 iterations")
    args = parser.parse_args(argv)
    iters, repeats = (4, 2) if args.quick else (args.iters, args.repeats)
    parts, wall, ranks = measure(iters, repeats)
    cpu = parts.sum(axis=1)
    ok = float(np.median(cpu)) <= args.target
    print(f"\nnon-compute CPU per iteration, tiny config, DP=2 ({repeats} blocks x {iters} iterations, "
          f"stand-in engine)")
    print(f"{'what':<34} {'median':>8} {'min':>8} {'max':>8}")
    print(f"{'CPU-s / iteration (all processes)':<34} {np.median(cpu):>8.4f} {cpu.min():>8.4f} {cpu.max():>8.4f}")
    rows = [  # columns: the driver, the ranks, then the rollout queue's actor
        ("  driver (holds the dock)", parts[:, 0]), ("  workers (all ranks)", parts[:, 1:1 + ranks].sum(1))]
    if parts.shape[1] > 1 + ranks:
        rows.append(("  rollout queue actor", parts[:, 1 + ranks:].sum(1)))
    for name, col in rows:
        print(f"{name:<34} {np.median(col):>8.4f} {col.min():>8.4f} {col.max():>8.4f}")
    print(f"{'wall s / iteration':<34} {np.median(wall):>8.4f} {wall.min():>8.4f} {wall.max():>8.4f}")
    print(f"target: median CPU-s / iteration <= {args.target:g}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
