"""Draw sources/images/remove_padding/dp_balance.png from a real GRPO run.

Runs the main job (tests/st/run_grpo.sh, CPU, about 20 s on a free machine) with a small
config that has one mini-batch per iteration, so every actor_train share is
one DP rank's batch, then plots the actor_train plan of the last iteration
from the run's balance.jsonl: per-rank tokens of a random split (before)
next to the balanced split (after).

Next to the PNG it writes the figure's data (dp_balance.json: the plan it drew, the ranks' measured tokens,
the numbers in the figure's title and the PNG's sha256); the numbers the docs quote are those
(tests/ut/test_dp_balance_figure.py recomputes them from the saved plan and checks the docs and the PNG).

    python docs/scripts/draw_dp_balance.py                      # fresh run
    python docs/scripts/draw_dp_balance.py --run /tmp/some_run  # reuse a run folder
    python docs/scripts/draw_dp_balance.py --from-data sources/images/remove_padding/dp_balance.json
    python docs/scripts/draw_dp_balance.py rl_config.n_samples_per_prompt=8  # extra overrides
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from mindspeed_rl.reports.balance_report import (  # noqa: E402
    ReportError, _balance_path, format_table, plot_reports, read_balance_file, report_from_run, select_plans)

DEFAULT_OUT = os.path.join(ROOT, "sources", "images", "remove_padding", "dp_balance.png")
TITLE = "DP batch balance: per-rank tokens, random split vs balanced"
DP_RANKS = 4
N_SAMPLES = 4
CONSUMER = "actor_train"
# 4 DP ranks, 16 prompts x 4 samples, one mini-batch per iteration, responses up to 48 tokens
RUN_OVERRIDES = [
    f"rl_config.actor_resource.num_npus={DP_RANKS}",
    f"rl_config.n_samples_per_prompt={N_SAMPLES}",
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


def n_samples_of(overrides, default=N_SAMPLES):
    """rl_config.n_samples_per_prompt as the overrides set it (the last one wins)."""
    for item in reversed(overrides):
        key, _, value = item.partition("=")
        if key == "rl_config.n_samples_per_prompt":
            return int(value)
    return default


def measured_rank_tokens(run_dir, iteration):
    """Per-rank tokens the update step really processed (metrics.jsonl), rank order."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("iteration") == iteration:
                ranks = sorted(int(k.rsplit("rank", 1)[1]) for k in rec if k.startswith(f"tokens/{CONSUMER}/rank"))
                return [rec[f"tokens/{CONSUMER}/rank{k}"] for k in ranks]
    return None


def build_report(run_dir, n_samples=N_SAMPLES, quiet=False):
    """The PlanReport the figure draws: the last iteration's actor_train plan, per DP rank."""
    (report,) = report_from_run(run_dir, consumer=CONSUMER)  # last iteration, one plan
    measured = measured_rank_tokens(run_dir, report.iteration)
    if measured and sorted(measured) == sorted(report.after):
        # one share per rank: show each rank's measured tokens under its own label
        report.after, report.share = [float(x) for x in measured], "rank"
        if not quiet:
            print(f"per-rank update tokens match the plan: {measured}")
    rows = sum(report.sizes)
    report.unit = "rows"  # actor_train is split by sample (row), not by GRPO group
    what = f"{rows} rows"
    if n_samples > 1 and rows % n_samples == 0:
        what += f" = {rows // n_samples} GRPO groups x {n_samples} samples"
    report.label = (f"GRPO run, {len(report.after)} DP ranks, iteration {report.iteration}, "
                    f"{CONSUMER} ({what})")
    return report


def figure_numbers(report):
    """The numbers of the figure's panel title, formatted as it prints them (and as the docs quote them)."""
    s = report.summary()
    return {"imbalance_before": f"{s['before']['imbalance']:.2%}",
            "imbalance_after": f"{s['after']['imbalance']:.2%}",
            "step_time_gain": f"{s['gain']:.3f}x"}


def figure_data(run_dir, report, n_samples):
    """What the figure was drawn from: the plan record, the measured per-rank tokens, the numbers."""
    file = _balance_path(run_dir)
    plans = [p for p in select_plans(read_balance_file(file), report.iteration, CONSUMER, file)]
    return {"iteration": report.iteration, "consumer": CONSUMER, "n_samples_per_prompt": n_samples,
            "plan": plans[-1], "rank_tokens": measured_rank_tokens(run_dir, report.iteration),
            "label": report.label, "numbers": figure_numbers(report)}


def report_from_data(data):
    """build_report over a run folder rebuilt from figure_data's record (no run needed)."""
    with tempfile.TemporaryDirectory(prefix="msrl_dp_balance_data_") as run_dir:
        with open(os.path.join(run_dir, "balance.jsonl"), "w", encoding="utf-8") as f:
            f.write(json.dumps(data["plan"]) + "\n")
        if data.get("rank_tokens"):
            rec = {"iteration": data["iteration"],
                   **{f"tokens/{CONSUMER}/rank{k}": v for k, v in enumerate(data["rank_tokens"])}}
            with open(os.path.join(run_dir, "metrics.jsonl"), "w", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
        return build_report(run_dir, data["n_samples_per_prompt"], quiet=True)


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def draw(run_dir, out, data_out, n_samples=N_SAMPLES):
    report = build_report(run_dir, n_samples)
    print(format_table(report))
    plot_reports([report], out, title=TITLE, width_px=800, font_scale=1.25)
    data = figure_data(run_dir, report, n_samples)
    data["png_sha256"] = sha256_of(out)
    with open(data_out, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"wrote {out} and {data_out}: imbalance {data['numbers']['imbalance_before']} -> "
          f"{data['numbers']['imbalance_after']}, step-time gain {data['numbers']['step_time_gain']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", metavar="DIR", help="reuse this run folder instead of running the job")
    parser.add_argument("--from-data", metavar="JSON", help="redraw from a saved dp_balance.json (no run)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="PNG path (default: %(default)s)")
    parser.add_argument("--data", metavar="JSON",
                        help="where the figure's data goes (default: the PNG's path with .json)")
    parser.add_argument("--n-samples", type=int, default=None,
                        help="samples per prompt of a --run folder, for the label (default: the overrides')")
    parser.add_argument("--keep", action="store_true", help="keep the temporary run folder")
    args, extra = parser.parse_known_args()
    bad = [a for a in extra if "=" not in a or a.startswith("-")]
    if bad:
        parser.error(f"unknown arguments {bad}; extra arguments are config overrides section.key=value")
    data_out = args.data or os.path.splitext(args.out)[0] + ".json"
    if args.from_data:
        if args.run or extra:
            parser.error("--from-data takes neither --run nor config overrides")
        with open(args.from_data, encoding="utf-8") as f:
            data = json.load(f)
        report = report_from_data(data)
        print(format_table(report))
        plot_reports([report], args.out, title=TITLE, width_px=800, font_scale=1.25)
        data.update(label=report.label, numbers=figure_numbers(report), png_sha256=sha256_of(args.out))
        with open(data_out, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out} and {data_out}")
        return 0
    n_samples = args.n_samples or n_samples_of(RUN_OVERRIDES + extra)
    run_dir = args.run
    if run_dir is None:
        run_dir = tempfile.mkdtemp(prefix="msrl_dp_balance_")
        run_grpo(run_dir, extra)
    elif extra:
        parser.error("config overrides need a fresh run; drop --run")
    try:
        draw(run_dir, args.out, data_out, n_samples)
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
