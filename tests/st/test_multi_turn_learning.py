"""Multi-turn rollouts with tools learn through the real job (Ray, DP=2, the CLI's run): on the toy tool task the
label is known only to the 'secret' tool, so a model that never calls it scores at most 0.25 on average, and one
that calls it but answers at random at most 0.1 + 0.9 * 0.25 = 0.325 (verifier tool_match). The tool-call rate
climbs from a random model's few percent to nearly every row, and the reward past both caps: the model reads the
tool's answer (that tool tokens leave the loss is tests/ut/workers/test_integrated_worker_long_tail.py's)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from cli.train_grpo import run  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
TOOL_TASK = ["megatron_training.data_path=toy:tool", 'rl_config.verifier_function=["tool_match"]',
             "rl_config.multi_turn_enable=true",
             f"rl_config.tool_config_path={os.path.join(ROOT, 'configs', 'tools', 'toy_secret.yaml')}",
             "rl_config.max_tool_calls=1", "rl_config.max_parallel_calls=1",
             "rl_config.max_total_response_length=8", "generate_config.sampling_config.max_tokens=2",
             "megatron_training.global_batch_size=16", "rl_config.n_samples_per_prompt=8",
             "rl_config.mini_batch_size=8", "rl_config.init_kl_coef=0.0", "actor_config.lr=3.0e-3",
             "megatron_training.train_iters=60", "rl_config.seed=7"]


def test_the_model_learns_to_call_the_tool_and_read_its_answer(tmp_path, capsys):
    history = run(CONFIG, TOOL_TASK, str(tmp_path), str(tmp_path / "tiny_model"))
    out = capsys.readouterr().out
    assert "multi-turn: tools ['secret']" in out
    rewards = np.array([m["reward/mean"] for m in history])
    calls = np.array([m["multi_turn/tool_call_rate"] for m in history])
    print(f"reward first-5 {rewards[:5].mean():.3f} last-5 {rewards[-5:].mean():.3f}; "
          f"tool-call rate first-5 {calls[:5].mean():.3f} last-5 {calls[-5:].mean():.3f}")
    assert calls[:5].mean() < 0.4 and calls[-5:].mean() > 0.9
    assert rewards[-5:].mean() > 0.4 and rewards[:5].mean() < 0.2
    last = history[-1]
    # a called row: call and EOS (model), the answer block (tool, 3 tokens), the answer and EOS (model)
    assert 0.3 < last["multi_turn/tool_token_fraction"] < 0.5
    assert last["multi_turn/turns_per_row"] > 1.8 and last["multi_turn/tool_errors"] == 0
