"""Draw sources/images/remove_padding/dp_balance.png from a real GRPO run.

Runs the main job (tests/st/run_grpo.sh, CPU, about 20 s) with a small
config that has one mini-batch per iteration, so every actor_train share is
one DP rank's batch, then plots the actor_train plan of the last iteration
from the run's balance.jsonl: per-rank tokens of a random split (before)
next to the balanced split (after).

    python docs/scripts/draw_dp_balance.py                      # fresh run
    python docs/scripts/draw_dp_balance.py --run /tmp/some_run  # reuse a run folder
    python docs/scripts/draw_dp_balance.py rl_config.n_samples_per_prompt=8  # extra overrides
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mindspeed_rl.tools.balance_report import (  # noqa: E402
    ReportError, format_table, plot_reports, report_from_run)

DEFAULT_OUT = os.path.join(ROOT, "sources", "images", "remove_padding", "dp_balance.png")
TITLE = "DP batch balance: per-rank tokens, random split vs balanced"
DP_RANKS = 4
# 4 DP ranks, 16 prompts x 4 samples, one mini-batch per iteration, responses up to 48 tokens
RUN_OVERRIDES = [
    f"rl_config.actor_resource.num_npus={DP_RANKS}",
    "rl_config.n_samples_per_prompt=4",
    "megatron_training.global_batch_size=16",
    "rl_config.mini_batch_size=16",
    "generate_config.sampling_config.max_tokens=48",
    "generate_config.max_model_len=64",
    "megatron_training.seq_length=64",
    "megatron_training.train_iters=2",
]


def run_grpo(out_dir, extra):
    """The main job, writing its run folder (balance.jsonl, metrics.jsonl) into out_dir."""
    cmd = ["bash", os.path.join(ROOT, "tests", "st", "run_grpo.sh"), *RUN_OVERRIDES, *extra]
    print("running:", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OUT_DIR": out_dir}, check=True)


def measured_rank_tokens(run_dir, iteration):
    """Per-rank tokens the update step really processed (metrics.jsonl), rank order."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("iteration") == iteration:
                ranks = sorted(int(k.rsplit("rank", 1)[1]) for k in rec if k.startswith("tokens/actor_train/rank"))
                return [rec[f"tokens/actor_train/rank{k}"] for k in ranks]
    return None


def draw(run_dir, out):
    (report,) = report_from_run(run_dir, consumer="actor_train")  # last iteration, one plan
    measured = measured_rank_tokens(run_dir, report.iteration)
    if measured and sorted(measured) == sorted(report.after):
        # one share per rank: show each rank's measured tokens under its own label
        report.after, report.share = [float(x) for x in measured], "rank"
        print(f"per-rank update tokens match the plan: {measured}")
    report.label = (f"GRPO run, {len(report.after)} DP ranks, iteration {report.iteration}, "
                    f"actor_train ({sum(report.sizes)} GRPO groups)")
    print(format_table(report))
    plot_reports([report], out, title=TITLE, width_px=800, font_scale=1.25)
    print(f"wrote {out}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", metavar="DIR", help="reuse this run folder instead of running the job")
    parser.add_argument("--out", default=DEFAULT_OUT, help="PNG path (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary run folder")
    args, extra = parser.parse_known_args()
    bad = [a for a in extra if "=" not in a or a.startswith("-")]
    if bad:
        parser.error(f"unknown arguments {bad}; extra arguments are config overrides section.key=value")
    run_dir = args.run
    if run_dir is None:
        run_dir = tempfile.mkdtemp(prefix="msrl_dp_balance_")
        run_grpo(run_dir, extra)
    elif extra:
        parser.error("config overrides need a fresh run; drop --run")
    try:
        draw(run_dir, args.out)
    except ReportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.run is None and not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        elif args.run is None:
            print(f"run folder kept: {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
