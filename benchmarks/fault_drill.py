"""End-to-end fault drill for issue 21: runs the tiny GRPO config as subprocesses and injects one
fault per row (signals to the run's own workers and driver, NaN rewards, a truncated shard,
bad save path, malformed JSONL). Per row it prints the exit code, the error line, the seconds from
injection to that line, whether the checkpoint left is loadable and whether a resume from it gives
metrics identical to an uninterrupted run. Exits 1 if a row hangs, loses data or ends without
its expected exit code and one error line.

    python benchmarks/fault_drill.py [--iters 6] [--wait 180] [--rows sigstop_worker,nan_rewards]

Only processes started by this script are signalled (found under the driver's process tree, by pid).
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

    def error_line(self):
        for t, name, text in self.lines:
            if text.startswith("error:") or text.startswith("warning: checkpoint"):
                return t, text
        return None, ""

    def traceback(self):
        return any("Traceback" in text for _, _, text in self.lines)


# ------------------------------------------------------------------ run helpers

def train_args(run_dir, iters, *extra, config="configs/grpo_tiny_cpu.yaml", save=True):
    args = [sys.executable, "cli/train_grpo.py", "--config", config,
            "--tiny-model-dir", os.path.join(ROOT, "tiny_model" + ("_text" if "math" in config else "")),
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


# name -> (function, expected exit code, leaves a checkpoint to resume from)
ROWS = {
    "sigstop_worker": (signal_row("sigstop_worker", "ray::IntegratedWorker", signal.SIGSTOP,
                                  extra=("rl_config.stage_timeout=20",)), 1, True),
    "sigkill_worker": (signal_row("sigkill_worker", "ray::IntegratedWorker", signal.SIGKILL), 1, True),
    "sigterm_driver": (signal_row("sigterm_driver", "driver", signal.SIGTERM), 143, True),
    "sigint_driver": (signal_row("sigint_driver", "driver", signal.SIGINT), 130, True),
    "sigkill_driver_save": (kill_driver_during_save, -9, True),
    "nan_rewards": (nan_rewards, 1, False),
    "truncated_shard": (truncated_shard, 0, False),
    "save_under_file": (save_under_file, 2, False),
    "malformed_jsonl": (malformed_jsonl, 2, False),
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

    table, bad = [], False
    for name in ARGS.rows.split(","):
        fn, expect_rc, resumable = ROWS[name]
        run_dir = os.path.join(ROOT, name)
        try:
            run, rc, left, injected, what = fn(run_dir)
        except Exception as err:  # noqa: BLE001  (a broken row is reported, the others still run)
            table.append({"fault": name, "line": f"drill error: {err!r}", "exit": None, "seconds": None,
                          "checkpoint": None, "loadable": None, "hang": False, "lost": True})
            print(json.dumps(table[-1]), flush=True)
            bad = True
            continue
        t_err, line = run.error_line()
        secs = None if (t_err is None or injected is None) else round(t_err - injected, 1)
        row = {"fault": name, "injected": what, "exit": rc, "expected_exit": expect_rc, "line": line,
               "seconds": secs, "traceback": run.traceback(), "left_processes": left,
               "left_names": run.left_names}
        hang = rc is None
        it, damage, stray = checkpoint_state(run_dir)
        row["checkpoint"] = it
        row["loadable"] = (damage is None) if it is not None else None
        row["stray_tmp"] = stray
        if name == "nan_rewards":
            row["loadable"] = "none written" if it is None else f"iteration {it} written from NaN state"
            lost = it is not None
        elif name == "truncated_shard":
            ok, why = same_as_baseline(run_dir, base, ARGS.iters)
            row["resume_identical"], row["resume_note"] = ok, why
            lost = not ok
        elif resumable:
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
        # a clear message: the expected exit code, one error line (none can come from a SIGKILLed driver)
        row["as_expected"] = (rc == expect_rc and bool(line or name == "sigkill_driver_save")
                              and not row["traceback"])
        bad = bad or hang or lost or not row["as_expected"]
        table.append(row)
        print(json.dumps(row), flush=True)

    print("\n| fault | exit | error line | s to message | checkpoint | loadable | resume identical | "
          "processes left 5 s after exit | stray temp folders |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in table:
        print(f"| {r['fault']} | {r['exit']} | {r['line'][:160]} | {r['seconds']} | {r['checkpoint']} | "
              f"{r['loadable']} | {r.get('resume_identical', 'n/a')} | {r.get('left_names')} | "
              f"{r.get('stray_tmp')} |")
    if ARGS.json:
        with open(ARGS.json, "w") as f:
            json.dump(table, f, indent=1)
    print("FAIL: a row hung, lost data or ended unclearly" if bad else "OK: no hang, nothing lost, clear messages")
    return 1 if bad else 0


ARGS = ROOT = None
if __name__ == "__main__":
    sys.exit(main())
