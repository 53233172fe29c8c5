"""Multi-turn rollouts with tools learn through the real job (Ray, DP=2, the CLI's run): on the toy tool task the
label is known only to the 'secret' tool, so a model that never calls it scores at most 0.25 on average, and one
that calls it but answers at random at most 0.1 + 0.9 * 0.25 = 0.325 (verifier tool_match). The tool-call rate
climbs from a random model's few percent to nearly every row, and the reward past both caps: the model reads the
tool's answer (that tool tokens leave the loss is tests/ut/workers/test_integrated_worker_long_tail.py's)."""
import os
import sys

import numpy as np

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", ".."), os.path.dirname(os.path.abspath(__file__))]
from cli.train_grpo import run  # noqa: E402
from tool_task_cases import LEARNING, TASK  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
CONFIG = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
# 45 iterations: by 41-45 the reward is past both caps (0.445 in benchmarks/results/bench_tool_learning.md)
TOOL_TASK = TASK + LEARNING + ["megatron_training.train_iters=45"]


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


def test_partial_rollout_carries_conversations_and_resumes_them(tmp_path, monkeypatch):
    """Passes of 4 tokens (max_total_response_length=8 / 2): a row that calls the tool (2 tokens) gets its 3-token
    answer past its pass's budget and is carried to the next iteration between turns; trained rows mask exactly
    the tool's answers out of the loss; a resume from the first checkpoint goes on as the straight run did. One
    worker, two iterations: about 33 s on a busy machine."""
    from mindspeed_rl.agent.tool_block import ToolBlock
    from mindspeed_rl.trainer.utils.carry_pool import CarryPool
    from transformers import AutoTokenizer
    taken, take = [], CarryPool.take

    def recording(self, count, iteration):
        columns, metrics = take(self, count, iteration)
        taken.append(columns)
        return columns, metrics
    monkeypatch.setattr(CarryPool, "take", recording)
    tiny, save = str(tmp_path / "tiny_model"), str(tmp_path / "ckpt")
    overrides = TASK + ["rl_config.partial_rollout_max_split=2", "rl_config.init_kl_coef=0.0", "rl_config.seed=7",
                        "rl_config.actor_resource.num_npus=1",
                        "megatron_training.train_iters=2", f"megatron_training.save={save}",
                        "megatron_training.save_interval=1"]
    straight = run(CONFIG, overrides, str(tmp_path / "a"), tiny)
    assert any(m["partial_rollout/continued_rows"] > 0 for m in straight)
    tok = AutoTokenizer.from_pretrained(tiny)
    block, called = ToolBlock(tok), 0
    for columns in taken:
        for response, mask, calls, label in zip(columns["responses"], columns["loss_mask"],
                                                columns["tool_call_num"], columns["labels"]):
            tool = (mask == 0).nonzero().reshape(-1)
            if int(calls) == 0:
                assert tool.numel() == 0
                continue
            called += 1  # one round: its answer (the row's label) is the only masked run of tokens
            answer = block.ids([tok.decode(label.tolist(), skip_special_tokens=True)])
            assert tool.tolist() == list(range(int(tool[0]), int(tool[0]) + len(answer)))
            assert response[tool].tolist() == answer
    assert called > 0
    resumed = run(CONFIG, overrides + [f"megatron_training.load={save}/iter_0000001",
                                       f"megatron_training.save={tmp_path}/ckpt_b"], str(tmp_path / "b"), tiny)
    keys = ("reward/mean", "actor/pg_loss", "partial_rollout/continued_rows", "multi_turn/tool_calls_per_row")
    assert [resumed[0][k] for k in keys] == [straight[1][k] for k in keys]


def test_a_tool_that_hangs_raises_and_floods_leaves_the_run_going(tmp_path):
    """Fault drill through the CLI's run: the toy task's 'secret' tool replaced by one whose calls, in turn, hang
    past tool_call_timeout, raise, answer 2 MB, or answer. Every fault becomes that call's answer and is counted;
    the run trains its iterations (one worker, two iterations)."""
    tools = tmp_path / "faulty.yaml"
    tools.write_text("tools:\n  - class_name: mindspeed_rl.tools.toy_tools.FaultyTool\n"
                     "    config: {type: native, hang_seconds: 3}\n"
                     "    tool_schema: {type: function, function: {name: secret, description: drill,\n"
                     "                  parameters: {type: object, properties: {}, required: []}}}\n")
    overrides = TASK + [f"rl_config.tool_config_path={tools}", "rl_config.tool_call_timeout=0.5",
                        "rl_config.max_tool_response_length=1", "rl_config.actor_resource.num_npus=1",
                        "megatron_training.global_batch_size=8", "rl_config.n_samples_per_prompt=8",
                        "rl_config.mini_batch_size=8", "megatron_training.train_iters=2", "rl_config.seed=7"]
    history = run(CONFIG, overrides, str(tmp_path / "a"), str(tmp_path / "tiny_model"))
    assert len(history) == 2
    calls = sum(m["multi_turn/tool_calls_per_row"] * 64 for m in history)
    timeouts = sum(m["multi_turn/tool_timeouts"] for m in history)
    errors = sum(m["multi_turn/tool_errors"] for m in history)
    assert calls >= 4 and timeouts >= 1 and errors >= 1, (calls, timeouts, errors)
    for m in history:  # the flood was cut to one character: no response grew past its bound
        assert m["response_length/max"] <= 8 and np.isfinite(m["actor/pg_loss"])
