"""End-to-end fault drill (issues 21 and 28): runs the tiny GRPO config as subprocesses and injects
one fault per row: signals to the run's own workers and driver, NaN rewards, a truncated shard, bad
save path, malformed JSONL; two runs into one folder, an inexact resume, a changed model shape or DP
size at resume, a full disk during a save, wrong key types, a non-ASCII run folder, configs that
cannot learn, a verifier failing on every row, a tracker with a non-ASCII digit. Per row it prints the
exit code, the one line the run ended with (or the line it was expected to say), the seconds from
injection to that line, whether the checkpoint left is loadable and whether a resume from it gives
metrics identical to an uninterrupted run. Exits 1 if a row hangs, loses data or ends without its
expected exit code and one clear line.

    python benchmarks/fault_drill.py [--iters 6] [--wait 180] [--rows sigstop_worker,nan_rewards]

Only processes started by this script are signalled (found under the driver's process tree, by pid).
The full-disk row mounts a small tmpfs (root only; skipped otherwise).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
COMPARED = ("reward/mean", "actor/pg_loss")


# ------------------------------------------------------------------ processes of one run

def _ppid_map():
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            fields = stat[stat.rindex(")") + 2:].split()
            out[int(name)] = (int(fields[1]), fields[19])  # ppid, start time
        except (OSError, ValueError, IndexError):
            pass
    return out


def descendants(root):
    """{pid: start time} of every process under ``root`` (root included)."""
    table = _ppid_map()
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in table and pid not in found:
            found[pid] = table[pid][1]
            todo.extend(children.get(pid, []))
    return found


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive_same(pid, start):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2:].split()[19] == start
    except (OSError, ValueError, IndexError):
        return False


class Run:
    """One driver subprocess: its output lines with times, and every process it ever had below it
    (so that what outlives a killed driver can be counted and removed by pid)."""

    def __init__(self, args, log_path):
        self.lines = []  # (monotonic time, stream, text)
        self.seen = {}
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self.log = open(log_path, "w")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._readers = [threading.Thread(target=self._read, args=(s, n), daemon=True)
                         for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for t in self._readers:
            t.start()
        self._stop = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _read(self, stream, name):
        for line in stream:
            self.lines.append((time.monotonic(), name, line.rstrip("\n")))
            self.log.write(f"[{name} {time.monotonic() - self.t0:7.2f}] {line}")
            self.log.flush()

    def _watch(self):
        while not self._stop.is_set() and self.proc.poll() is None:
            self.seen.update(descendants(self.proc.pid))
            time.sleep(0.3)

    def wait_line(self, pred, timeout):
        end = time.monotonic() + timeout
        i = 0
        while time.monotonic() < end:
            while i < len(self.lines):
                if pred(self.lines[i][2]):
                    return self.lines[i]
                i += 1
            if self.proc.poll() is not None and i >= len(self.lines):
                time.sleep(0.2)
                if i >= len(self.lines):
                    return None
            time.sleep(0.005)
        return None

    def actors(self, marker):
        self.seen.update(descendants(self.proc.pid))
        return sorted(p for p, s in self.seen.items() if alive_same(p, s) and marker in cmdline(p))

    def finish(self, timeout):
        """(exit code or None on a hang, processes of the run still alive 5 s after it ended)."""
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        self._stop.set()
        for t in self._readers:
            t.join(timeout=5)
        time.sleep(5)  # give Ray's tear-down its moment before counting what is left
        left = {p: s for p, s in self.seen.items() if p != self.proc.pid and alive_same(p, s)}
        self.left_names = sorted(os.path.basename(cmdline(p).split(" ")[0]) or str(p) for p in left)
        for pid, start in left.items():  # only processes this run started, by pid
            if alive_same(pid, start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if rc is None:
            try:
                self.proc.kill()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.log.close()
        return rc, len(left)

    def error_line(self, has=None):
        """The first line holding ``has``, else the first ``error:`` (or checkpoint warning) line."""
        for t, name, text in self.lines:
            if (has in text) if has else (text.startswith("error:") or text.startswith("warning: checkpoint")):
                return t, text
        return None, ""

    def error_lines(self):
        return sum(1 for _, _, text in self.lines if text.startswith("error:"))

    def traceback(self):
        return any("Traceback" in text for _, _, text in self.lines)


# ------------------------------------------------------------------ run helpers

def train_args(run_dir, iters, *extra, config="configs/grpo_tiny_cpu.yaml", save=True, model="tiny_model"):
    args = [sys.executable, "cli/train_grpo.py", "--config", config,
            "--tiny-model-dir", os.path.join(ROOT, model + ("_text" if "math" in config else "")),
            "--output-dir", os.path.join(run_dir, "out"), f"megatron_training.train_iters={iters}"]
    if save:
        args += [f"megatron_training.save={os.path.join(run_dir, 'ckpt')}", "megatron_training.save_interval=1"]
    return args + list(extra)


def metrics(run_dir):
    path = os.path.join(run_dir, "out", "metrics.jsonl")
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "iteration" in r]


def checkpoint_state(run_dir):
    """(tracker iteration or None, damage or None, stray temporary folders)."""
    from mindspeed_rl.utils.checkpoint import damage, iteration_dir
    root = os.path.join(run_dir, "ckpt")
    tracker = os.path.join(root, "latest_checkpointed_iteration.txt")
    if not os.path.exists(tracker):
        return None, None, 0
    with open(tracker) as f:
        it = int(f.read().strip())
    stray = sum(1 for n in os.listdir(root) if n.startswith(".tmp-") or n.startswith(".old-"))
    return it, damage(iteration_dir(root, it)), stray


def same_as_baseline(run_dir, base, iters):
    rows = metrics(run_dir)
    its = [r["iteration"] for r in rows]
    if its != list(range(1, iters + 1)):
        return False, f"iterations {its}"
    for r in rows:
        b = base[r["iteration"]]
        for key in COMPARED:
            if r[key] != b[key]:
                return False, f"iteration {r['iteration']} {key} {r[key]!r} != {b[key]!r}"
    return True, f"{len(rows)} iterations equal"


# ------------------------------------------------------------------ rows

SAVED = lambda n: (lambda text: text.startswith("saved checkpoint") and f"iter_{n:07d}" in text)  # noqa: E731


def last_saved(run):
    """The newest iteration the run said it saved (None when none)."""
    its = [int(t.split("iter_")[1][:7]) for _, _, t in run.lines if t.startswith("saved checkpoint")]
    return max(its) if its else None


def signal_row(name, target, sig, extra=(), after=1):
    """Run; once iteration ``after`` is saved, send ``sig`` to one process of the run (mid-run: the
    next iteration's rollout)."""
    def row(run_dir):
        run = Run(train_args(run_dir, ARGS.iters, *extra), os.path.join(run_dir, "log.txt"))
        hit = run.wait_line(SAVED(after), ARGS.wait)
        injected, what = None, "run ended before injection"
        if hit:
            if target == "driver":
                pids = [run.proc.pid]
            else:
                pids = run.actors(target)
            if pids:
                os.kill(pids[0], sig)
                injected, what = time.monotonic(), f"{signal.Signals(sig).name} {target} pid {pids[0]}"
            else:
                what = f"no process '{target}' found"
        rc, left = run.finish(ARGS.wait)
        return run, rc, left, injected, what
    row.__name__ = name
    return row


def kill_driver_during_save(run_dir):
    """SIGKILL of the driver while iteration 2's temporary checkpoint folder exists."""
    run = Run(train_args(run_dir, ARGS.iters), os.path.join(run_dir, "log.txt"))
    root = os.path.join(run_dir, "ckpt")
    injected, what = None, "no save of iteration 2 seen"
    end = time.monotonic() + ARGS.wait
    while time.monotonic() < end and run.proc.poll() is None:
        try:
            names = os.listdir(root)
        except OSError:
            names = []
        if any(n.startswith(".tmp-iter_0000002") for n in names):
            os.kill(run.proc.pid, signal.SIGKILL)
            injected, what = time.monotonic(), "SIGKILL driver during save of iteration 2"
            break
        time.sleep(0.002)
    rc, left = run.finish(ARGS.wait)
    return run, rc, left, injected, what


def nan_rewards(run_dir):
    # config only: a NaN verifier weight makes every reward NaN
    run = Run(train_args(run_dir, ARGS.iters, "rl_config.verifier_weight=[.nan]"), os.path.join(run_dir, "log.txt"))
    injected = run.t0
    rc, left = run.finish(ARGS.wait)
    return run, rc, left, injected, "rl_config.verifier_weight=[.nan] (from start)"


def truncated_shard(run_dir):
    """Copy the baseline's checkpoints, cut the newest iteration's largest shard in half, resume."""
    shutil.copytree(os.path.join(ROOT, "baseline", "ckpt"), os.path.join(run_dir, "ckpt"))
    dcp = os.path.join(run_dir, "ckpt", f"iter_{ARGS.iters:07d}", "dcp")
    shard = max((os.path.join(dcp, n) for n in os.listdir(dcp) if n.endswith(".distcp")), key=os.path.getsize)
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    # the run folder's records up to the checkpoint, as the interrupted run would have left them
    os.makedirs(os.path.join(run_dir, "out"))
    shutil.copy(os.path.join(ROOT, "baseline", "out", "metrics.jsonl"), os.path.join(run_dir, "out"))
    run = Run(train_args(run_dir, ARGS.iters, f"megatron_training.load={os.path.join(run_dir, 'ckpt')}"),
              os.path.join(run_dir, "log.txt"))
    injected = run.t0
    rc, left = run.finish(ARGS.wait)
    return run, rc, left, injected, f"newest shard {os.path.basename(shard)} cut to half, resume"


def save_under_file(run_dir):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "file"), "w") as f:
        f.write("x")
    args = train_args(run_dir, ARGS.iters, save=False) + [
        f"megatron_training.save={os.path.join(run_dir, 'file', 'ckpt')}", "megatron_training.save_interval=1"]
    run = Run(args, os.path.join(run_dir, "log.txt"))
    rc, left = run.finish(ARGS.wait)
    return run, rc, left, run.t0, "save=<regular file>/ckpt (from start)"


def malformed_jsonl(run_dir):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(REPO, "data", "math_word_problems.jsonl")) as f:
        lines = f.readlines()[:40]
    lines[6] = lines[6].rstrip("\n")[:-5] + "\n"  # line 7 loses its closing characters
    bad = os.path.join(run_dir, "bad.jsonl")
    with open(bad, "w") as f:
        f.writelines(lines)
    run = Run(train_args(run_dir, 2, f"megatron_training.data_path={bad}", config="configs/grpo_math_cpu.yaml"),
              os.path.join(run_dir, "log.txt"))
    rc, left = run.finish(ARGS.wait)
    return run, rc, left, run.t0, "line 7 of a JSONL data file cut (from start)"


# ------------------------------------------------------------------ rows of issue 28
# A "custom" row returns (run, exit code, processes left, injection time, what, verdict): the verdict
# says whether anything was lost and how it was checked.

def _baseline_copy(run_dir):
    """The baseline's checkpoints and run-folder records, as an interrupted run would have left them."""
    shutil.copytree(os.path.join(ROOT, "baseline", "ckpt"), os.path.join(run_dir, "ckpt"))
    os.makedirs(os.path.join(run_dir, "out"))
    for name in ("metrics.jsonl", "balance.jsonl"):
        shutil.copy(os.path.join(ROOT, "baseline", "out", name), os.path.join(run_dir, "out"))


def _records_text(run_dir):
    with open(os.path.join(run_dir, "out", "metrics.jsonl"), "rb") as f:
        return f.read()


def _untouched(run_dir, before):
    """Nothing lost: the run folder's records as they were (no resume marker, nothing dropped) and
    the checkpoint the tracker names still loadable."""
    it, damage, _ = checkpoint_state(run_dir)
    same = _records_text(run_dir) == before
    return {"lost": not same or damage is not None,
            "note": f"metrics.jsonl {'unchanged' if same else 'CHANGED'}; checkpoint {it} "
                    f"{'loadable' if damage is None else damage}", "checkpoint": it, "loadable": damage is None}


def two_runs_one_folder(run_dir):
    """Two runs started together into one --output-dir and one save folder."""
    args = train_args(run_dir, ARGS.iters)
    a = Run(args, os.path.join(run_dir, "log_a.txt"))
    b = Run(args, os.path.join(run_dir, "log_b.txt"))
    (rca, lefta), (rcb, leftb) = a.finish(ARGS.wait), b.finish(ARGS.wait)
    refused, rc, ran_rc = (a, rca, rcb) if rca != 0 else (b, rcb, rca)
    try:
        ok, why = same_as_baseline(run_dir, BASE, ARGS.iters)
    except ValueError as err:  # a torn record
        ok, why = False, str(err)
    verdict = {"lost": not ok or ran_rc != 0, "note": f"the other run: exit {ran_rc}, {why}"}
    return refused, rc, lefta + leftb, refused.t0, "two runs started together, same folders", verdict


def inexact_resume(run_dir):
    """Resume under upstream's DAPO settings no_load_optim / no_load_rng: continues, and says what it left."""
    _baseline_copy(run_dir)
    ckpt = os.path.join(run_dir, "ckpt")
    run = Run(train_args(run_dir, ARGS.iters, f"megatron_training.load={ckpt}/iter_0000003",
                         "megatron_training.no_load_optim=true", "megatron_training.no_load_rng=true"),
              os.path.join(run_dir, "log.txt"))
    rc, left = run.finish(ARGS.wait)
    rows = metrics(run_dir)
    its = [r["iteration"] for r in rows]
    differs = [r["iteration"] for r in rows if r["iteration"] > 3 and r["actor/pg_loss"] != BASE[r["iteration"]]["actor/pg_loss"]]
    verdict = {"lost": its != list(range(1, ARGS.iters + 1)),
               "note": f"iterations {its[0]}-{its[-1]}; pg_loss differs from the uninterrupted run in iterations "
                       f"{differs} (as asked)" if its else "no iterations"}
    return run, rc, left, run.t0, "resume from iteration 3 with no_load_optim, no_load_rng", verdict


def _refused_resume(run_dir, what, *extra, model="tiny_model", tracker=None):
    _baseline_copy(run_dir)
    if tracker is not None:
        with open(os.path.join(run_dir, "ckpt", "latest_checkpointed_iteration.txt"), "w", encoding="utf-8") as f:
            f.write(tracker)
    before = _records_text(run_dir)
    run = Run(train_args(run_dir, ARGS.iters, *extra, model=model), os.path.join(run_dir, "log.txt"))
    rc, left = run.finish(ARGS.wait)
    if tracker is not None:  # the checkpoint itself is fine: put the tracker back to check it
        with open(os.path.join(run_dir, "ckpt", "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(f"{ARGS.iters}\n")
    return run, rc, left, run.t0, what, _untouched(run_dir, before)


def shape_change_resume(run_dir):
    return _refused_resume(run_dir, "resume with num_layers 2 -> 3 (a matching model folder)",
                           f"megatron_training.load={os.path.join(run_dir, 'ckpt', 'iter_0000003')}",
                           "model.tiny_qwen2.num_layers=3", model="tiny_model_3layers")


def dp_change_resume(run_dir):
    return _refused_resume(run_dir, "resume a DP=2 checkpoint with DP=4",
                           f"megatron_training.load={os.path.join(run_dir, 'ckpt', 'iter_0000003')}",
                           "rl_config.actor_resource.num_npus=4")


def tracker_non_ascii(run_dir):
    return _refused_resume(run_dir, "tracker holds '\uff13' (a full-width 3)",
                           f"megatron_training.load={os.path.join(run_dir, 'ckpt')}", tracker="\uff13\n")


def disk_full_save(run_dir):
    """The save folder on a tmpfs with room for one checkpoint: the save of iteration 2 fills it."""
    if os.geteuid() != 0:
        raise SkipRow("needs root to mount a size-limited tmpfs")
    ckpt = os.path.join(run_dir, "ckpt")
    os.makedirs(ckpt)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1800k", "tmpfs", ckpt], check=True)
    try:
        run = Run(train_args(run_dir, ARGS.iters), os.path.join(run_dir, "log.txt"))
        rc, left = run.finish(ARGS.wait)
        shutil.copytree(ckpt, ckpt + "_kept")
    finally:
        subprocess.run(["umount", ckpt], check=False)
    os.rmdir(ckpt)
    os.rename(ckpt + "_kept", ckpt)  # resumed from on a normal disk
    return run, rc, left, run.t0, "save folder on a 1.8 MB tmpfs (one checkpoint fits)"


def _config_run(run_dir, what, *extra, config="configs/grpo_tiny_cpu.yaml", iters=None):
    os.makedirs(run_dir, exist_ok=True)
    run = Run(train_args(run_dir, iters or ARGS.iters, *extra, config=config, save=False),
              os.path.join(run_dir, "log.txt"))
    rc, left = run.finish(ARGS.wait)
    return run, rc, left, run.t0, what


def wrong_type_override(run_dir):
    return _config_run(run_dir, "megatron_training.global_batch_size=eight", "megatron_training.global_batch_size=eight")


def wrong_type_yaml(run_dir):
    os.makedirs(run_dir)
    with open(os.path.join(REPO, "configs", "grpo_tiny_cpu.yaml"), encoding="utf-8") as f:
        text = f.read().replace("  max_prompt_length: 8", "  max_prompt_length: [8]")
    bad = os.path.join(run_dir, "bad.yaml")
    with open(bad, "w", encoding="utf-8") as f:
        f.write(text)
    return _config_run(run_dir, "rl_config.max_prompt_length: [8] in the YAML", config=bad)


def non_ascii_run_folder(run_dir):
    """A short --output-dir with non-ASCII characters (Ray's session files would go inside it)."""
    short = os.path.join(ROOT, "\u8fd0")  # '运': short enough that Ray's files would go under it
    run = Run(train_args(short, ARGS.iters), os.path.join(run_dir, "log.txt"))
    rc, left = run.finish(ARGS.wait)
    ok, why = same_as_baseline(short, BASE, ARGS.iters)
    return run, rc, left, run.t0, f"--output-dir {short}/out", {"lost": not ok, "note": why}


def _cannot_learn(run_dir, what, *extra):
    dry = subprocess.run([sys.executable, "cli/train_grpo.py", "--config", "configs/grpo_tiny_cpu.yaml", "--dry-run",
                          *extra], cwd=REPO, capture_output=True, text=True, timeout=ARGS.wait)
    said = [line for line in dry.stdout.splitlines() if line.startswith("note: nothing can be learned")]
    run, rc, left, t0, _ = _config_run(run_dir, what, *extra, iters=2)
    rows = metrics(run_dir)
    zero = [r.get("advantages/zero_frac") for r in rows]
    loss = [r.get("actor/pg_loss") for r in rows]
    ok = bool(said) and rows and all(z == 1.0 for z in zero)
    return run, rc, left, t0, what, {"lost": not ok, "note": f"--dry-run: {'says it' if said else 'SILENT'}; "
                                                            f"advantages/zero_frac {zero}, pg_loss {loss}"}


def single_sample(run_dir):
    return _cannot_learn(run_dir, "rl_config.n_samples_per_prompt=1", "rl_config.n_samples_per_prompt=1")


def zero_weight(run_dir):
    return _cannot_learn(run_dir, "rl_config.verifier_weight=[0.0]", "rl_config.verifier_weight=[0.0]")


def verifier_raises(run_dir):
    run, rc, left, t0, what = _config_run(
        run_dir, "a verifier raising on every row",
        "rl_config.verifier_function=[benchmarks.drill_verifiers:always_raises]",
        f"megatron_training.save={os.path.join(run_dir, 'ckpt')}", "megatron_training.save_interval=1")
    it = checkpoint_state(run_dir)[0]
    return run, rc, left, t0, what, {"lost": it is not None,
                                     "note": "no checkpoint written from it" if it is None else f"saved {it}"}


class SkipRow(Exception):
    """The row cannot run here (said in the table)."""


# name -> (function, expected exit code, kind, text the one line must hold); kind: "resumable" (leaves a
# checkpoint to resume from), "custom" (the function's own verdict), "none", or the rows named in main()
ROWS = {
    "sigstop_worker": (signal_row("sigstop_worker", "ray::IntegratedWorker", signal.SIGSTOP,
                                  extra=("rl_config.stage_timeout=20",)), 1, "resumable", None),
    "sigkill_worker": (signal_row("sigkill_worker", "ray::IntegratedWorker", signal.SIGKILL), 1, "resumable", None),
    "sigterm_driver": (signal_row("sigterm_driver", "driver", signal.SIGTERM), 143, "resumable", None),
    "sigint_driver": (signal_row("sigint_driver", "driver", signal.SIGINT), 130, "resumable", None),
    "sigkill_driver_save": (kill_driver_during_save, -9, "resumable", None),
    "nan_rewards": (nan_rewards, 1, "nan", None),
    "truncated_shard": (truncated_shard, 0, "truncated", None),
    "save_under_file": (save_under_file, 2, "none", None),
    "malformed_jsonl": (malformed_jsonl, 2, "none", None),
    "two_runs_one_folder": (two_runs_one_folder, 2, "custom", "is in use by another run"),
    "inexact_resume": (inexact_resume, 0, "custom", "left behind: optimizer state"),
    "shape_change_resume": (shape_change_resume, 1, "custom", "Missing key in checkpoint state_dict"),
    "dp_change_resume": (dp_change_resume, 2, "custom", "holds RNG state for 2 rank(s), this run has 4"),
    "disk_full_save": (disk_full_save, 1, "resumable", "No space left on device"),
    "wrong_type_override": (wrong_type_override, 2, "none", "megatron_training.global_batch_size expects int"),
    "wrong_type_yaml": (wrong_type_yaml, 2, "none", "rl_config.max_prompt_length expects int, got [8]"),
    "non_ascii_run_folder": (non_ascii_run_folder, 0, "custom", "note: Ray's session files go to"),
    "single_sample": (single_sample, 0, "custom", "warning: nothing can be learned"),
    "zero_weight": (zero_weight, 0, "custom", "warning: nothing can be learned"),
    "verifier_raises": (verifier_raises, 1, "custom", "the rewards failed on every row"),
    "tracker_non_ascii": (tracker_non_ascii, 2, "custom", "should hold an iteration number in ASCII digits"),
}


def main():
    global ARGS, ROOT
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--wait", type=float, default=180.0, help="bound on every subprocess wait (s)")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--root", default=None, help="work folder (default: a new /tmp/fdrill_* folder)")
    p.add_argument("--json", default=None, help="write the table as JSON here")
    ARGS = p.parse_args()
    ROOT = ARGS.root or tempfile.mkdtemp(prefix="fdrill_", dir="/tmp")  # short: Ray socket paths
    print(f"work folder: {ROOT}", flush=True)

    base_dir = os.path.join(ROOT, "baseline")
    run = Run(train_args(base_dir, ARGS.iters), os.path.join(ROOT, "baseline.log"))
    rc, left = run.finish(ARGS.wait)
    base = {r["iteration"]: r for r in metrics(base_dir)}
    if rc != 0 or len(base) != ARGS.iters:
        print(f"baseline failed: exit {rc}, {len(base)} iterations; see {ROOT}/baseline.log")
        return 1
    print(f"baseline: {ARGS.iters} iterations, exit 0, {left} processes left after exit", flush=True)

    global BASE
    BASE = base
    table, bad = [], False
    for name in ARGS.rows.split(","):
        fn, expect_rc, kind, has = ROWS[name]
        run_dir = os.path.join(ROOT, name)
        try:
            run, rc, left, injected, what, *verdict = fn(run_dir)
        except SkipRow as why:
            table.append({"fault": name, "line": f"skipped: {why}", "exit": None, "seconds": None,
                          "checkpoint": None, "loadable": None, "hang": False, "lost": False, "verdict": "skipped"})
            print(json.dumps(table[-1]), flush=True)
            continue
        except Exception as err:  # noqa: BLE001  (a broken row is reported, the others still run)
            table.append({"fault": name, "line": f"drill error: {err!r}", "exit": None, "seconds": None,
                          "checkpoint": None, "loadable": None, "hang": False, "lost": True})
            print(json.dumps(table[-1]), flush=True)
            bad = True
            continue
        t_err, line = run.error_line(has)
        secs = None if (t_err is None or injected is None) else round(t_err - injected, 1)
        row = {"fault": name, "injected": what, "exit": rc, "expected_exit": expect_rc, "line": line,
               "seconds": secs, "traceback": run.traceback(), "left_processes": left,
               "left_names": run.left_names}
        hang = rc is None
        it, damage, stray = checkpoint_state(run_dir)
        row["checkpoint"] = it
        row["loadable"] = (damage is None) if it is not None else None
        row["stray_tmp"] = stray
        if kind == "custom":
            row.update(verdict[0])
            lost = row["lost"]
        elif kind == "nan":
            row["loadable"] = "none written" if it is None else f"iteration {it} written from NaN state"
            lost = it is not None
        elif kind == "truncated":
            ok, why = same_as_baseline(run_dir, base, ARGS.iters)
            row["resume_identical"], row["resume_note"] = ok, why
            lost = not ok
        elif kind == "resumable":
            said = last_saved(run)
            row["last_saved_said"] = said
            # lost: the tracker is behind a save the run reported, or names a damaged folder
            lost = damage is not None or (said is not None and (it is None or it < said))
            if it is not None and damage is None and not hang:
                res = Run(train_args(run_dir, ARGS.iters, f"megatron_training.load={os.path.join(run_dir, 'ckpt')}"),
                          os.path.join(run_dir, "resume.txt"))
                rrc, rleft = res.finish(ARGS.wait)
                ok, why = same_as_baseline(run_dir, base, ARGS.iters)
                row["stray_tmp_after_resume"] = checkpoint_state(run_dir)[2]
                row["resume_exit"], row["resume_identical"], row["resume_note"] = rrc, ok, why
                hang = hang or rrc is None
                lost = lost or not ok
        else:
            lost = False
        row["hang"], row["lost"] = hang, lost
        # a clear message: the expected exit code, one line (with the expected text), no traceback
        # (none can come from a SIGKILLed driver)
        row["as_expected"] = (rc == expect_rc and bool(line or name == "sigkill_driver_save")
                              and not row["traceback"] and run.error_lines() <= 1)
        row["verdict"] = ("nothing lost, one clear line, no hang" if row["as_expected"] and not lost and not hang
                          else "FAIL: " + ", ".join(w for w, b in (("lost", lost), ("hang", hang),
                                                                     ("unclear", not row["as_expected"])) if b))
        bad = bad or hang or lost or not row["as_expected"]
        table.append(row)
        print(json.dumps(row), flush=True)

    print("\n| fault | exit | line | s to message | checkpoint | loadable | resume identical / check | "
          "processes left 5 s after exit | verdict |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in table:
        check = r.get("resume_identical", r.get("note", "n/a"))
        print(f"| {r['fault']} | {r['exit']} | {r['line'][:200]} | {r['seconds']} | {r['checkpoint']} | "
              f"{r['loadable']} | {check} | {r.get('left_names')} | {r.get('verdict')} |")
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(table, f, indent=1)
    print("FAIL: a row hung, lost data or ended unclearly" if bad else "OK: no hang, nothing lost, clear messages")
    return 1 if bad else 0


ARGS = ROOT = BASE = None
if __name__ == "__main__":
    sys.exit(main())
