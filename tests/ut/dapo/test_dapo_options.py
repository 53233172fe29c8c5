"""DAPO dynamic sampling away from its defaults: no limit on refill batches, the refill's rollout
seeds, and which score the group filter reads when a penalty and several reward functions apply
(the in-process harness of test_dapo_sampling)."""
import pytest
import torch

import mindspeed_rl.trainer.dapo_trainer_hybrid as dapo
import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.algorithms import DRIVER_STAGES
from mindspeed_rl.plan.stages import FILTER_METRIC, ROLLOUT
from ut.dapo.test_dapo_sampling import Reward, _trainer, batches, local  # noqa: F401  (fixture)


def sparse_batches(size=8, limit=500):
    """Prompt batch k: one odd (kept) group, the other groups all-equal (dropped); at most ``limit`` batches (a
    filter that never fills fails instead of drawing forever)."""
    for k in range(limit):
        yield {"prompts": [torch.tensor([10 + k, j]) for j in range(size)],
               "labels": [torch.tensor([1 if j == 0 else 0]) for j in range(size)]}
    raise AssertionError(f"the test's data ran out after {limit} prompt batches")


@pytest.mark.parametrize("limit", ["0", "-1"])
def test_no_limit_draws_batches_until_the_train_batch_is_full(local, limit):
    trainer, _ = _trainer(f"rl_config.filter_groups_max_batches={limit}")
    data = sparse_batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    # one kept group a batch, 6 wanted: the default limit (5 here) would stop one batch short
    assert m["dapo/rollout_batches"] == 6 and m["dapo/train_groups"] == 6 and m["dapo/batch_full"] == 1.0
    assert trainer.data_position == 6


def test_a_limit_stops_at_that_many_batches(local):
    trainer, _ = _trainer("rl_config.filter_groups_max_batches=5")
    data = sparse_batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    assert m["dapo/rollout_batches"] == 5 and m["dapo/train_groups"] == 5 and m["dapo/batch_full"] == 0.0


def _first_rows(monkeypatch):
    """Each rollout batch's first row of every share, read when the filter runs on that batch."""
    firsts = []
    original = DRIVER_STAGES.get("filter_groups")

    def spy(trainer, stage):
        firsts.append([share[0] for rank in trainer.transfer_dock.plan_stage(ROLLOUT.name) for share in rank])
        return original(trainer, stage)

    monkeypatch.setitem(DRIVER_STAGES.functions, "filter_groups", spy)
    return firsts


def test_refill_rollouts_are_seeded_by_the_data_position(local, monkeypatch):
    firsts = _first_rows(monkeypatch)
    trainer, workers = _trainer("rl_config.guarantee_order=true")  # fixed shares: the plan names the first rows
    plan = trainer.run_plan
    data = batches()
    trainer.data_iter = data
    trainer.step(1, next(data))  # 2 rollout batches: data positions 1 and 2
    base = plan.worker.sampling.seed if plan.worker.sampling.seed is not None else plan.seed
    assert len(firsts) == 2
    seeds = [s for w in workers for s in w.actor.seeds]
    assert sorted(seeds) == sorted(iw.rollout_seed(base, position, first)
                                   for position, shares in zip((1, 2), firsts) for first in shares)
    # a run resumed at data position 1 samples its first batch as the straight run's refill did
    resumed, again = _trainer("rl_config.guarantee_order=true", data_position=1)
    data2 = batches(start=1)
    resumed.data_iter = data2
    resumed.step(2, next(data2))
    assert firsts[2] == firsts[1]
    refill = {iw.rollout_seed(base, 2, first) for first in firsts[1]}
    assert refill <= {s for w in again for s in w.actor.seeds}


class Other:
    """A second reward function: a constant, under its own verifier name."""

    def __call__(self, responses, labels):
        scores = torch.full((len(responses),), 0.5)
        self.last_scores = {"other": scores}
        return scores


def test_the_filter_reads_its_verifiers_own_scores(local, monkeypatch):
    # max_tokens 10, buffer 8: every response over 2 tokens is penalised in rm_scores
    trainer, _ = _trainer("rl_config.overlong_buffer_enable=true", "rl_config.overlong_buffer=8",
                          "rl_config.overlong_buffer_penalty_factor=1.0", "rl_config.rollout_max_tokens=10")
    weighted = Reward()
    weighted.weight = 2.0
    trainer.reward_list = [Other(), weighted]
    seen = []
    original = DRIVER_STAGES.get("filter_groups")

    def spy(trainer, stage):
        rows = list(range(stage.rows_per_share))
        got = trainer.transfer_dock.get_rows([FILTER_METRIC, "rm_scores", "response_length"], rows)
        seen.append({k: torch.cat([v.reshape(-1).float() for v in got[k]]) for k in got})
        return original(trainer, stage)

    monkeypatch.setitem(DRIVER_STAGES.functions, "filter_groups", spy)
    data = batches()
    trainer.data_iter = data
    trainer.step(1, next(data))
    assert len(seen) == 2  # two rollout batches (k = 0, 1)
    for k, cols in enumerate(seen):
        lengths = cols["response_length"]
        odd = torch.tensor([(k + r // 3) % 2 == 1 for r in range(lengths.numel())])  # prompt r // 3's label
        raw = torch.where(odd, lengths, torch.ones_like(lengths))  # Reward's own score, before its weight
        penalty = -(lengths - 2).clamp(min=0, max=8) / 8
        assert torch.equal(cols[FILTER_METRIC], raw)
        assert torch.allclose(cols["rm_scores"], 2.0 * raw + 0.5 + penalty)
    assert any(bool((c["response_length"] > 2).any()) for c in seen)  # a penalty applied


def test_queued_refill_rollouts_are_seeded_by_the_data_position_and_each_chunks_first_row(local):
    trainer, workers = _trainer()
    plan = trainer.run_plan
    data = batches()
    trainer.data_iter = data
    trainer.step(1, next(data))  # 2 rollout batches: data positions 1 and 2
    base = plan.worker.sampling.seed if plan.worker.sampling.seed is not None else plan.seed
    chunk = plan.stages[ROLLOUT.name].rows_per_share
    firsts = range(0, plan.rows_per_round, chunk)  # transformers generate: fixed chunks of the queue order
    seeds = [s for w in workers for s in w.actor.seeds]
    assert sorted(seeds) == sorted(iw.rollout_seed(base, position, first) for position in (1, 2) for first in firsts)
