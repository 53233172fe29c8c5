"""Per-iteration metrics to stdout, a JSONL file and TensorBoard (when installed);
Loggers: upstream's named console logger."""
import json
import logging
import os
from datetime import datetime, timezone
from typing import Dict, List, Optional


class MetricsLogger:
    def __init__(self, output_dir: Optional[str] = None, use_tensorboard: bool = False):
        self.jsonl = None
        self.balance = None
        self.tensorboard = None
        if output_dir:
            os.makedirs(output_dir, exist_ok=True)
            self.jsonl = open(os.path.join(output_dir, "metrics.jsonl"), "a", encoding="utf-8")
            self.balance = open(os.path.join(output_dir, "balance.jsonl"), "a", encoding="utf-8")
            if use_tensorboard:
                try:
                    from torch.utils.tensorboard import SummaryWriter
                    self.tensorboard = SummaryWriter(os.path.join(output_dir, "tensorboard"))
                except ImportError:
                    print("tensorboard is not installed; metrics go to stdout and JSONL only")

    def log(self, iteration: int, metrics: Dict[str, float], line: str):
        print(line, flush=True)
        if self.jsonl:
            self.jsonl.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
            self.jsonl.flush()
        if self.tensorboard:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(f"train/{key}", value, iteration)

    def log_balance(self, iteration: int, plans: List[dict]):
        """Per-share loads of each DP-balance plan (``balance.jsonl``), for reports."""
        if self.balance:
            for plan in plans:
                self.balance.write(json.dumps({"iteration": iteration, **plan}) + "\n")
            self.balance.flush()

    def close(self):
        if self.balance:
            self.balance.close()
        if self.jsonl:
            self.jsonl.close()
        if self.tensorboard:
            self.tensorboard.close()


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
