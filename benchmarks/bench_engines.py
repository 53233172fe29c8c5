"""Step time of the DDP engine vs the sharded engines on the tiny model (CPU, gloo).

    python benchmarks/bench_engines.py [--iters 8]

Runs the tiny GRPO config once per engine in this process (same data, same
seed) and prints the median and min-max over iterations 2..N of the
iteration time and of the update stage (slowest rank). No target: on a
2-layer model FSDP's per-layer collectives dominate, which says nothing about
7B; the table is there to see the overhead, not to pass.
"""
import argparse
import os
import statistics
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "grpo_tiny_cpu.yaml")
ENGINES = {
    "ddp (DP=2)": [],
    "fsdp (DP=2)": ["megatron_training.use_distributed_optimizer=true"],
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=8)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    from cli.train_grpo import run
    from mindspeed_rl.utils.ray_utils import init_ray
    import ray
    rows = []
    with tempfile.TemporaryDirectory(prefix="msrl_bench_engines_") as tmp:
        started = init_ray(num_cpus=2, log_to_driver=False)
        try:
            for name, overrides in ENGINES.items():
                history = run(CONFIG, overrides + [f"megatron_training.train_iters={args.iters}"],
                              os.path.join(tmp, name.split()[0]), os.path.join(tmp, "model"))
                steady = history[1:]
                it = [m["timing/iteration"] for m in steady]
                up = [m["timing/actor_train/max"] for m in steady]
                gen = [m["timing/actor_rollout/max"] for m in steady]
                rows.append((name, it, up, gen, history[-1]["reward/mean"]))
        finally:
            if started:
                ray.shutdown()
    def cell(values):
        return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

    print(f"{'engine':14s}{'iteration s':>24s}{'update s':>24s}{'rollout s':>24s}{'last reward':>13s}")
    print(f"{'':14s}{'median (min-max)':>24s}{'median (min-max)':>24s}{'median (min-max)':>24s}")
    for name, it, up, gen, reward in rows:
        print(f"{name:14s}{cell(it):>24s}{cell(up):>24s}{cell(gen):>24s}{reward:13.3f}")
    base = statistics.median(rows[0][1])
    for name, it, *_ in rows[1:]:
        print(f"{name} / {rows[0][0]} iteration time: {statistics.median(it) / base:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
