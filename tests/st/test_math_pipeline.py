"""Real data end to end on the shipped math set: preprocess to a token cache, then
one GRPO iteration from it with base_acc (pipeline only: the tiny model does not learn math)."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "grpo_math_cpu.yaml")


def test_preprocess_then_train_from_the_cache(tmp_path):
    cache = str(tmp_path / "cache")
    subprocess.run([sys.executable, "cli/preprocess_data.py", "math_word_problems", f"output_prefix={cache}"],
                   cwd=ROOT, check=True)
    history = run(CONFIG, ["megatron_training.train_iters=1", f"megatron_training.data_path={cache}"],
                  str(tmp_path / "run"), str(tmp_path / "model"))
    m = history[0]
    rows = 8 * 4
    outcomes = sum(v for k, v in m.items() if k.startswith("reward/base_acc/") and not k.endswith("/mean"))
    assert outcomes == rows  # every response went through base_acc, each with one outcome
    assert 0.0 <= m["reward/base_acc/mean"] <= 1.0 and m["prompt_length/mean"] > 500  # the qwen_r1 template
