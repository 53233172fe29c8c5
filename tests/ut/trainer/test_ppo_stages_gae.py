"""PPO's GAE stage without the KL stage (use_kl_in_reward off): each row's score is its last token's reward;
the stage's advantage metrics describe the whitened advantages it wrote."""
import math

import numpy as np
import pytest
import torch

from mindspeed_rl.plan.run_plan import Layout, RunPlan, StagePlan
from mindspeed_rl.plan.stages import GAE_ADV
from mindspeed_rl.data.driver_dock import DriverDock

LENGTHS = [2, 1, 3]
SCORES = [1.0, -1.0, 3.0]
VALUES = [[0.25, 0.5], [0.75], [0.0, 1.0, -0.5]]


def run_gae(dock, stage, gamma, lam):
    """The advantage stage's registered function with the 'gae' estimator, on ``dock``."""
    from types import SimpleNamespace

    from mindspeed_rl.algorithms.spec import AdvantageSpec
    from mindspeed_rl.trainer.driver_stages import compute_advantage
    plan = SimpleNamespace(advantage=AdvantageSpec(gamma, lam, name="gae", critic=True), n_samples=1)
    trainer = SimpleNamespace(transfer_dock=dock, run_plan=plan, iteration=1,
                              reward_guard=SimpleNamespace(check_advantages=lambda *a: None))
    return compute_advantage(trainer, stage)


def _dock():
    gae = StagePlan(GAE_ADV.name, 3, 1, False, stage=GAE_ADV, inputs=GAE_ADV.inputs)
    plan = RunPlan(Layout(1, 1, 1), prompts_per_round=3, n_samples=1, mini_batch_rows=3, epochs=1, train_iters=1,
                   stages={GAE_ADV.name: gae})
    dock = DriverDock(3, 1, run_plan=plan)
    dock.start_round({"prompts": [torch.tensor([1, 2])] * 3})
    dock.put_experience({"rm_scores": [torch.tensor([s]) for s in SCORES],
                         "response_length": [torch.tensor([n]) for n in LENGTHS],
                         "values": [torch.tensor(v) for v in VALUES]}, [0, 1, 2])
    return dock, gae


def test_gae_without_token_rewards_puts_the_score_on_the_last_token():
    assert "token_level_rewards" not in GAE_ADV.inputs
    dock, gae = _dock()
    gamma, lam = 0.9, 0.8
    metrics = run_gae(dock, gae, gamma, lam)
    raw, returns = [], []
    for score, values, n in zip(SCORES, VALUES, LENGTHS):
        rewards = [0.0] * (n - 1) + [score]
        nxt = values[1:] + [0.0]
        advantage, out = 0.0, []
        for t in reversed(range(n)):
            advantage = rewards[t] + gamma * nxt[t] - values[t] + gamma * lam * advantage
            out.append(advantage)
        out.reverse()
        raw.append(out)
        returns.append([a + v for a, v in zip(out, values)])
    flat = np.array([a for row in raw for a in row])
    white = (flat - flat.mean()) / math.sqrt(flat.var(ddof=1) + 1e-8)
    rows = [t.tolist() for t in dock.get_rows(["advantages", "returns"], [0, 1, 2])["advantages"]]
    assert [len(r) for r in rows] == LENGTHS
    assert [a for row in rows for a in row] == pytest.approx(white.tolist(), abs=1e-5)
    got_returns = [t.tolist() for t in dock.get_rows(["returns"], [0, 1, 2])["returns"]]
    assert got_returns == [pytest.approx(r, abs=1e-6) for r in returns]
    # the advantage metrics are those of the written (whitened) advantages: mean 0, std 1, no zeros
    assert metrics["advantages/mean"] == pytest.approx(white.mean(), abs=1e-6)
    assert metrics["advantages/std"] == pytest.approx(white.std(ddof=1), abs=1e-4)
    assert metrics["advantages/zero_frac"] == 0.0
    assert metrics["critic/returns_mean"] == pytest.approx(np.mean([r for row in returns for r in row]))
    assert metrics["critic/values_mean"] == pytest.approx(np.mean([v for row in VALUES for v in row]))


def test_multi_turn_gae_runs_over_the_models_tokens_with_the_score_on_the_last_of_them():
    """Row 2 (3 tokens) is model, tool, tool: the tool tokens are skipped and the score, written on the last
    response token (a tool's), moves to the model's last token; the result equals GAE of the model's tokens alone."""
    from mindspeed_rl.plan.stages import LOSS_MASK
    gae = StagePlan(GAE_ADV.name, 3, 1, False, stage=GAE_ADV, inputs=GAE_ADV.inputs + (LOSS_MASK,))
    plan = RunPlan(Layout(1, 1, 1), prompts_per_round=3, n_samples=1, mini_batch_rows=3, epochs=1, train_iters=1,
                   stages={GAE_ADV.name: gae})
    masks = [[1, 1], [1], [1, 0, 0]]
    dock = DriverDock(3, 1, run_plan=plan)
    dock.start_round({"prompts": [torch.tensor([1, 2])] * 3})
    dock.put_experience({"rm_scores": [torch.tensor([s]) for s in SCORES],
                         "response_length": [torch.tensor([n]) for n in LENGTHS],
                         "values": [torch.tensor(v) for v in VALUES],
                         LOSS_MASK: [torch.tensor(m, dtype=torch.int8) for m in masks]}, [0, 1, 2])
    gamma, lam = 0.9, 0.8
    run_gae(dock, gae, gamma, lam)
    raw = []
    for score, values, mask in zip(SCORES, VALUES, masks):
        model = [v for v, m in zip(values, mask) if m]  # the model's tokens only, the score on the last
        rewards = [0.0] * (len(model) - 1) + [score]
        nxt, advantage, out = model[1:] + [0.0], 0.0, []
        for t in reversed(range(len(model))):
            advantage = rewards[t] + gamma * nxt[t] - model[t] + gamma * lam * advantage
            out.append(advantage)
        raw.append(out[::-1])
    flat = np.array([a for row in raw for a in row])
    white = (flat - flat.mean()) / math.sqrt(flat.var(ddof=1) + 1e-8)
    got = [t.tolist() for t in dock.get_rows(["advantages"], [0, 1, 2])["advantages"]]
    assert got[2][1:] == [0.0, 0.0]  # the tool's tokens get no advantage
    model_advantages = [a for row, mask in zip(got, masks) for a, m in zip(row, mask) if m]
    assert model_advantages == pytest.approx(white.tolist(), abs=1e-5)


def test_model_token_rewards_moves_what_lies_on_tool_tokens_and_keeps_rows_without_model_tokens_empty():
    from mindspeed_rl.algorithms.gae import model_token_rewards
    rewards = torch.tensor([[0.5, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    model = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.int8)
    moved, on = model_token_rewards(rewards, mask, model)
    assert on.tolist() == [[True, True, False, False], [True, True, False, False], [False] * 4]
    assert moved.tolist() == [[0.5, 2.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0] * 4]
