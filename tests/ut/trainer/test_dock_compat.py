"""Upstream's pull API (compat.transfer_dock) and the driver stage of rewards."""
import pytest
import torch

from mindspeed_rl.compat.transfer_dock import PullDock as Dock
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import GROUP_ADV, REWARD
from mindspeed_rl.trainer.utils import compute_utils
from mindspeed_rl.data.driver_dock import DriverDock

COLS = ["prompts", "responses", "prompt_length", "response_length"]


def run_advantage(dock, stage, n_samples):
    """The advantage stage's registered function with the run's default estimator (group_norm), on ``dock``."""
    from types import SimpleNamespace

    from mindspeed_rl.algorithms.spec import AdvantageSpec
    from mindspeed_rl.trainer.driver_stages import compute_advantage
    trainer = SimpleNamespace(transfer_dock=dock, iteration=1,
                              run_plan=SimpleNamespace(advantage=AdvantageSpec(), n_samples=n_samples),
                              reward_guard=SimpleNamespace(check_advantages=lambda *a: None))
    return compute_advantage(trainer, stage)


def _ready(dock, rows, lengths):
    dock.put_experience({"responses": [torch.ones(n, dtype=torch.long) for n in lengths],
                         "response_length": [torch.tensor([n]) for n in lengths]}, rows)


def test_balanced_pull_serves_exactly_the_count_asked_while_the_pool_has_it():
    dock = Dock(8, 1)
    dock.put_prompts_experience({"prompts": [torch.ones(2, dtype=torch.long)] * 8})
    _ready(dock, [0, 1, 2, 3, 4], [5, 1, 9, 2, 7])  # 5 usable rows, 3 asked
    batch, rows = dock.get_experience("actor_train", COLS, 3, get_n_samples=False, use_batch_seqlen_balance=True)
    assert len(rows) == 3 and len(batch["responses"]) == 3
    _ready(dock, [5, 6, 7], [3, 3, 3])
    taken = list(rows)
    for _ in range(8):  # at most one request per row before the empty answer
        batch, rows = dock.get_experience("actor_train", COLS, 3, get_n_samples=False,
                                          use_batch_seqlen_balance=True)
        if rows is None:
            break
        taken += rows
        assert len(rows) == 3 or sorted(taken) == list(range(8))  # only the last batch may be short
    else:
        pytest.fail(f"the dock still serves rows after 8 requests: {taken}")
    assert sorted(taken) == list(range(8))


def _reward_dock():
    cfgs = build_configs(load_config("configs/grpo_tiny_cpu.yaml", ["megatron_training.model_path=/unused"]))
    plan = cfgs.plan
    dock = DriverDock(plan.prompts_per_round, plan.n_samples, addition_columns=["labels"], run_plan=plan)
    prompts = [torch.tensor([1, 2, i]) for i in range(plan.prompts_per_round)]
    dock.put_prompts_experience({"prompts": prompts, "labels": [torch.tensor([i]) for i in range(len(prompts))]},
                                ["labels"])
    lengths = [1 + (3 * r) % 7 for r in range(plan.rows_per_round)]
    _ready(dock, list(range(plan.rows_per_round)), lengths)
    return plan, dock, lengths


class Weighted:
    def __init__(self, fn, weight):
        self.fn, self.weight = fn, weight

    def __call__(self, responses, labels):
        return self.fn(responses, labels)


def test_rewards_stage_combines_every_reward_with_its_weight_in_row_order():
    plan, dock, lengths = _reward_dock()
    by_length = Weighted(lambda resp, labels: torch.tensor([float(r.numel()) for r in resp]), 0.5)
    by_label = Weighted(lambda resp, labels: torch.tensor([float(int(x)) for x in labels]), 2.0)
    metrics = compute_utils.compute_rewards(dock, plan.stages[REWARD.name], [by_length, by_label])
    adv_metrics = run_advantage(dock, plan.stages[GROUP_ADV.name], plan.n_samples)
    labels = [r // plan.n_samples for r in range(plan.rows_per_round)]  # repeated per sample, not tiled
    want = torch.tensor([0.5 * n + 2.0 * lab for n, lab in zip(lengths, labels)])
    scores = torch.cat([s.reshape(1) for s in dock.experience_data["rm_scores"]])
    assert torch.allclose(scores, want)
    rows = list(dock.experience_data["advantages"])
    assert [a.numel() for a in rows] == list(lengths)  # one value on each response token of the row
    adv = torch.cat([a.reshape(-1)[:1] for a in rows])
    assert all(torch.equal(a.reshape(-1), a.reshape(-1)[:1].expand(a.numel())) for a in rows)
    groups = want.view(-1, plan.n_samples)
    assert torch.allclose(adv, ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6))
                          .reshape(-1), atol=1e-5)
    assert metrics["reward/mean"] == pytest.approx(float(want.mean()))
    tokens = torch.cat([a.reshape(-1) for a in rows])
    assert adv_metrics["advantages/mean"] == pytest.approx(float(tokens.mean()), abs=1e-6)
    assert adv_metrics["advantages/zero_frac"] == pytest.approx(float((tokens == 0).float().mean()))
    assert metrics["response_length/max"] == max(lengths)


def test_rewards_stage_rejects_a_reward_with_the_wrong_row_count():
    plan, dock, _ = _reward_dock()
    short = Weighted(lambda resp, labels: torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="gave 3 scores for 32 responses"):
        compute_utils.compute_rewards(dock, plan.stages[REWARD.name], [short])
    assert not bool(dock.experience_data_status["rm_scores"].any())  # nothing written
