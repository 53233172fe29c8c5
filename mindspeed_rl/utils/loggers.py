"""Per-iteration metrics to stdout, a JSONL file and TensorBoard (when installed)."""
import json
import os
from typing import Dict, Optional


class MetricsLogger:
    def __init__(self, output_dir: Optional[str] = None, use_tensorboard: bool = False):
        self.jsonl = None
        self.tensorboard = None
        if output_dir:
            os.makedirs(output_dir, exist_ok=True)
            self.jsonl = open(os.path.join(output_dir, "metrics.jsonl"), "a", encoding="utf-8")
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

    def close(self):
        if self.jsonl:
            self.jsonl.close()
        if self.tensorboard:
            self.tensorboard.close()
