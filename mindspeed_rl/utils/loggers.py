"""Per-iteration metrics to stdout, a JSONL file, TensorBoard (when installed) and Weights & Biases
(rl_config.use_wandb; utils/wandb_log.py);
Loggers: upstream's named console logger.

A run folder belongs to one run: a fresh run stops (``check_run_folder``) when
the folder already holds another run's records; a run resumed from iteration N
keeps the records up to N, drops later ones and writes one marker line
``{"event": "resume", "from_iteration": N, ...}`` (it has no ``iteration`` key) once its checkpoint
has loaded. Each record is appended whole (one write on an append-only descriptor); the run lock
(utils/run_lock.py) keeps a second run out of the folder."""
import json
import logging
import os
from datetime import datetime, timezone
from typing import Dict, List, Optional

METRICS_FILE = "metrics.jsonl"
BALANCE_FILE = "balance.jsonl"
TIMELINE_FILE = "timeline.jsonl"  # the async modes: when each engine and the trainer were busy (wall clock)
RESUME_EVENT = "resume"


def read_records(path: str) -> List[dict]:
    """The JSON lines of a metrics or balance file (markers included)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path} line {line_no}: not valid JSON ({exc.msg})") from None
    return records


def _iterations(path: str) -> List[int]:
    if not os.path.isfile(path):
        return []
    return [r["iteration"] for r in read_records(path) if isinstance(r, dict) and "iteration" in r]


def check_run_folder(output_dir: str, resume_from: Optional[int] = None) -> None:
    """A fresh run (``resume_from`` None or 0) may not write into a folder that
    holds another run's metrics: raise one line naming the folder."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"--output-dir {output_dir!r} is a file, not a folder")
    if resume_from:
        return
    for name in (METRICS_FILE, BALANCE_FILE):
        done = _iterations(os.path.join(output_dir, name))
        if done:
            raise ValueError(f"--output-dir {output_dir!r} already holds another run's {name} (iterations "
                             f"{min(done)}-{max(done)}); give a new --output-dir, remove that folder, or resume "
                             f"that run from its checkpoint (megatron_training.load)")


def _keep_until(path: str, iteration: int) -> List[int]:
    """Drop the records after ``iteration`` (rewritten atomically); returns the dropped iterations."""
    if not os.path.isfile(path):
        return []
    records = read_records(path)
    # records after the resume point, and markers of resumes from after it
    late = [isinstance(r, dict) and max(r.get("iteration", 0), r.get("from_iteration", 0)) > iteration
            for r in records]
    if any(late):
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r, drop in zip(records, late) if not drop)
        os.replace(tmp, path)
    return sorted({r["iteration"] for r, drop in zip(records, late) if drop and "iteration" in r})


class _Records:
    """A JSONL file written one whole batch of records per ``os.write`` on an ``O_APPEND`` descriptor:
    two writers never interleave bytes inside a record."""

    def __init__(self, path: str, fresh: bool):
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if fresh else 0)
        self.fd = os.open(path, flags, 0o644)

    def write(self, records: List[dict]) -> None:
        data = memoryview("".join(json.dumps(r) + "\n" for r in records).encode("utf-8"))
        while data:  # a regular file takes it in one call; a short write (disk full) goes on from there
            data = data[os.write(self.fd, data):]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class MetricsLogger:
    def __init__(self, output_dir: Optional[str] = None, use_tensorboard: bool = False,
                 resume_from: Optional[int] = None, checkpoint: Optional[str] = None, wandb=None):
        """``resume_from``: the iteration a resumed run starts after (None or 0: a fresh run, which
        refuses a folder holding another run's records); ``checkpoint`` goes into the resume marker.
        A resumed run touches nothing (no dropped records, no marker) until ``start`` is called
        once its checkpoint has loaded (or its first record is logged). ``wandb``: a
        ``wandb_log.WandbSettings`` (None: no wandb)."""
        self.jsonl = None
        self.wandb_settings, self.wandb = wandb, None
        self.balance = None
        self.timeline = None
        self.tensorboard = None
        self.output_dir, self.use_tensorboard = output_dir, use_tensorboard
        self.resume_from, self.checkpoint = resume_from, checkpoint
        self.started = False
        if output_dir:
            check_run_folder(output_dir, resume_from)
            os.makedirs(output_dir, exist_ok=True)
        if not resume_from:
            self.start()

    def start(self) -> None:
        """Open the files: a fresh run's empty, a resumed run's cut at the resume point and marked."""
        if self.started:
            return
        self.started = True
        if self.wandb_settings is not None:
            from mindspeed_rl.utils.wandb_log import WandbRun
            self.wandb = WandbRun(self.wandb_settings, self.output_dir, self.resume_from)
        if not self.output_dir:
            return
        self.jsonl = self._open(os.path.join(self.output_dir, METRICS_FILE))
        self.balance = self._open(os.path.join(self.output_dir, BALANCE_FILE))
        if self.use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                # purge_step: events after the resume point are dropped, as in the JSONL files
                self.tensorboard = SummaryWriter(os.path.join(self.output_dir, "tensorboard"),
                                                 purge_step=self.resume_from + 1 if self.resume_from else None)
            except ImportError:
                print("tensorboard is not installed (pip install tensorboard); metrics go to stdout and "
                      "JSONL only")

    def _open(self, path: str) -> _Records:
        resume_from = self.resume_from
        if not resume_from:
            return _Records(path, fresh=True)
        dropped = _keep_until(path, resume_from)
        if dropped:
            which = (f"iteration {dropped[0]}" if len(dropped) == 1
                     else f"iterations {dropped[0]}-{dropped[-1]}")
            print(f"{path}: dropped the records of {which} (after the resume point {resume_from})", flush=True)
        records = _Records(path, fresh=False)
        records.write([{"event": RESUME_EVENT, "from_iteration": resume_from, "checkpoint": self.checkpoint,
                        "dropped_iterations": dropped,
                        "time": datetime.now(tz=timezone.utc).isoformat(timespec="seconds")}])
        return records

    def log(self, iteration: int, metrics: Dict[str, float], line: str):
        self.start()
        print(line, flush=True)
        if self.jsonl:
            self.jsonl.write([{"iteration": iteration, **metrics}])
        if self.tensorboard:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(f"train/{key}", value, iteration)
        if self.wandb:
            self.wandb.log(iteration, metrics)

    def log_balance(self, iteration: int, plans: List[dict]):
        """Per-share loads of each DP-balance plan (``balance.jsonl``), for reports."""
        self.start()
        if self.balance and plans:
            self.balance.write([{"iteration": iteration, **plan} for plan in plans])

    def log_timeline(self, iteration: int, spans: List[dict]):
        """The spans of an async iteration (``timeline.jsonl``, opened with the first; reports/async_timeline.py)."""
        self.start()
        if not self.output_dir or not spans:
            return
        if self.timeline is None:
            self.timeline = self._open(os.path.join(self.output_dir, TIMELINE_FILE))
        self.timeline.write([{"iteration": iteration, **span} for span in spans])

    def close(self):
        if self.timeline:
            self.timeline.close()
        if self.balance:
            self.balance.close()
        if self.jsonl:
            self.jsonl.close()
        if self.tensorboard:
            self.tensorboard.close()
        if self.wandb:
            self.wandb.close()


class Loggers:
    """A named stdlib logger with one console handler; ``info`` etc. take optional
    ``iteration``/``steps`` to prefix the message (dict messages become ``key : value`` pairs)."""

    def __init__(self, name: str = "root", logger_level: int = logging.INFO):
        self.logger = logging.getLogger(name)
        self.logger.setLevel(logger_level)
        if not self.logger.handlers:
            handler = logging.StreamHandler()
            handler.setLevel(logger_level)
            handler.setFormatter(logging.Formatter("%(asctime)s - %(levelname)s - %(message)s"))
            self.logger.addHandler(handler)
        self.logger.propagate = False

    @staticmethod
    def handle_msg(msg, level: str, iteration=None, steps=None) -> str:
        now = datetime.now(tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        if iteration is None or steps is None:
            return f"[{now}] {level} {msg}"
        if isinstance(msg, dict):
            body = " | ".join(f"{k} : {v:.4e}" if k.endswith("/lr") else f"{k} : {v:.4f}" for k, v in msg.items())
        else:
            body = str(msg)
        return f"[{now}] iteration: {iteration} / {steps} | {body}"

    def info(self, msg, iteration=None, steps=None):
        # under torch.distributed only the last rank logs info
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized() and dist.get_rank() != dist.get_world_size() - 1:
            return
        self.logger.info(self.handle_msg(msg, "INFO", iteration, steps))

    def warning(self, msg, iteration=None, steps=None):
        self.logger.warning(self.handle_msg(msg, "WARNING", iteration, steps))

    def debug(self, msg, iteration=None, steps=None):
        self.logger.debug(self.handle_msg(msg, "DEBUG", iteration, steps))

    def error(self, msg, iteration=None, steps=None):
        self.logger.error(self.handle_msg(msg, "ERROR", iteration, steps))
