"""Per-iteration metrics to stdout, a JSONL file and TensorBoard (when installed)."""
import json
import os
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
