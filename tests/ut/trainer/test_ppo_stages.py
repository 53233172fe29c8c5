"""PPO's driver stages on a real dock, against sums worked out here: the KL shaping of the token rewards (its
direction, KL(old || ref), and its metric over real tokens only) and GAE with whitened advantages."""
import math

import numpy as np
import pytest
import torch

from mindspeed_rl.plan.run_plan import Layout, RunPlan, StagePlan
from mindspeed_rl.plan.stages import GAE_ADV, KL_REWARD
from mindspeed_rl.trainer.utils import ppo_stages
from mindspeed_rl.data.driver_dock import DriverDock

LENGTHS = [1, 2, 3]
OLD = [[-1.0], [-0.5, -2.0], [-1.5, -0.25, -3.0]]
REF = [[-2.0], [-0.5, -1.0], [-0.5, -0.75, -2.0]]
SCORES = [1.0, 0.0, 2.0]


def run_gae(dock, stage, gamma, lam):
    """The advantage stage's registered function with the 'gae' estimator, on ``dock``."""
    from types import SimpleNamespace

    from mindspeed_rl.algorithms.spec import AdvantageSpec
    from mindspeed_rl.trainer.driver_stages import compute_advantage
    plan = SimpleNamespace(advantage=AdvantageSpec(gamma, lam, name="gae", critic=True), n_samples=1)
    trainer = SimpleNamespace(transfer_dock=dock, run_plan=plan, iteration=1,
                              reward_guard=SimpleNamespace(check_advantages=lambda *a: None))
    return compute_advantage(trainer, stage)


def _dock(with_rewards=False):
    kl = StagePlan(KL_REWARD.name, 3, 1, False, stage=KL_REWARD, inputs=KL_REWARD.inputs)
    gae_inputs = GAE_ADV.inputs + (("token_level_rewards",) if with_rewards else ())
    gae = StagePlan(GAE_ADV.name, 3, 1, False, stage=GAE_ADV, inputs=gae_inputs)
    plan = RunPlan(Layout(1, 1, 1), prompts_per_round=3, n_samples=1, mini_batch_rows=3, epochs=1, train_iters=1,
                   stages={KL_REWARD.name: kl, GAE_ADV.name: gae})
    dock = DriverDock(3, 1, run_plan=plan)
    dock.start_round({"prompts": [torch.tensor([1, 2])] * 3})
    dock.put_experience({"rm_scores": [torch.tensor([s]) for s in SCORES],
                         "response_length": [torch.tensor([n]) for n in LENGTHS],
                         "old_log_prob": [torch.tensor(r) for r in OLD], "ref_log_prob": [torch.tensor(r) for r in REF],
                         "values": [torch.tensor([0.5] * n) for n in LENGTHS]}, [0, 1, 2])
    return dock, kl, gae


def _rows(dock, column):
    return [t.tolist() for t in dock.get_rows([column], [0, 1, 2])[column]]


@pytest.mark.parametrize("kind", ["kl", "low_var_kl"])
def test_token_rewards_take_the_kl_of_the_rollout_policy_from_the_reference(kind):
    dock, kl_stage, _ = _dock()
    metrics = ppo_stages.compute_kl_rewards(dock, kl_stage, kl_coef=0.5, kl_penalty=kind)

    def kl(old, ref):  # KL(old || ref) per sampled token: old - ref, or k3 of the log ratio ref - old
        return old - ref if kind == "kl" else math.exp(ref - old) - (ref - old) - 1.0
    want = []
    for old, ref, score in zip(OLD, REF, SCORES):
        row = [-0.5 * kl(o, r) for o, r in zip(old, ref)]
        row[-1] += score
        want.append(row)
    assert _rows(dock, "token_level_rewards") == [pytest.approx(row) for row in want]
    every = [kl(o, r) for old, ref in zip(OLD, REF) for o, r in zip(old, ref)]
    assert metrics == {"actor/reward_kl": pytest.approx(np.mean(every)), "actor/reward_kl_coef": 0.5}
    # the mean is over the 6 real tokens: the padding of the two short rows does not dilute it
    assert metrics["actor/reward_kl"] != pytest.approx(sum(every) / 9)


def test_gae_runs_back_over_each_rows_tokens_and_whitens_the_advantages():
    dock, kl_stage, _ = _dock()
    ppo_stages.compute_kl_rewards(dock, kl_stage, kl_coef=0.5, kl_penalty="kl")
    _, _, gae = _dock(with_rewards=True)  # the GAE stage that reads the KL-shaped rewards
    metrics = run_gae(dock, gae, 0.9, 0.8)
    rewards = _rows(dock, "token_level_rewards")
    raw, returns = [], []
    for row, n in zip(rewards, LENGTHS):  # delta_t = r_t + gamma v_{t+1} - v_t; A_t = delta_t + gamma lam A_{t+1}
        values = [0.5] * n + [0.0]
        advantage, out = 0.0, []
        for t in reversed(range(n)):
            delta = row[t] + 0.9 * values[t + 1] - values[t]
            advantage = delta + 0.9 * 0.8 * advantage
            out.append(advantage)
        out.reverse()
        raw.append(out)
        returns.append([a + 0.5 for a in out])
    flat = np.array([a for row in raw for a in row])
    white = (flat - flat.mean()) / math.sqrt(flat.var(ddof=1) + 1e-8)
    got = [a for row in _rows(dock, "advantages") for a in row]
    assert got == pytest.approx(white.tolist(), abs=1e-5)
    assert _rows(dock, "returns") == [pytest.approx(r) for r in returns]
    assert metrics["critic/returns_mean"] == pytest.approx(np.mean([r for row in returns for r in row]))
    assert metrics["critic/values_mean"] == pytest.approx(0.5)


def test_multi_turn_rows_take_no_kl_on_the_tools_tokens():
    from mindspeed_rl.plan.stages import LOSS_MASK
    kl_stage = StagePlan(KL_REWARD.name, 3, 1, False, stage=KL_REWARD, inputs=KL_REWARD.inputs + (LOSS_MASK,))
    plan = RunPlan(Layout(1, 1, 1), prompts_per_round=3, n_samples=1, mini_batch_rows=3, epochs=1, train_iters=1,
                   stages={KL_REWARD.name: kl_stage})
    dock = DriverDock(3, 1, run_plan=plan)
    dock.start_round({"prompts": [torch.tensor([1, 2])] * 3})
    masks = [[1], [1, 0], [1, 0, 1]]
    dock.put_experience({"rm_scores": [torch.tensor([s]) for s in SCORES],
                         "response_length": [torch.tensor([n]) for n in LENGTHS],
                         "old_log_prob": [torch.tensor(r) for r in OLD], "ref_log_prob": [torch.tensor(r) for r in REF],
                         LOSS_MASK: [torch.tensor(m, dtype=torch.int8) for m in masks]}, [0, 1, 2])
    ppo_stages.compute_kl_rewards(dock, kl_stage, kl_coef=0.5, kl_penalty="kl")
    want = []
    for old, ref, score, mask in zip(OLD, REF, SCORES, masks):
        row = [-0.5 * (o - r) * m for o, r, m in zip(old, ref, mask)]
        row[-1] += score
        want.append(row)
    assert _rows(dock, "token_level_rewards") == [pytest.approx(row) for row in want]
