"""Dynamic sampling on partial rollout's pool (both parts of the sync trainer mode at once), in-process as
test_dapo_sampling: the filter runs on each take of complete groups, keeps the groups whose rewards vary, and
more passes and takes follow until the train batch is full; the pool's rows carry between iterations."""
import pytest
import torch

import mindspeed_rl.trainer.dapo_trainer_hybrid as dapo
import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.workers.parallel_state import ParallelState
from tests.ut.dapo.test_dapo_sampling import DAPO, TINY, Engine, Group, Reward, _trained, batches

EOS = 13
PARTIAL = ("rl_config.partial_rollout_max_split=2",)  # max_tokens 10: at most 5 new tokens a pass


class PassEngine(Engine):
    """A fresh row (prompt [a, b]) gets 1 + (seed + i) % 7 tokens: ending in EOS when they fit the pass's
    ``max_new_tokens``, else cut there; a continued row (its prompt holds earlier tokens) ends in 1 + (seed + i) % 3
    more. Lengths vary within a group, so odd-label groups' rewards vary."""

    def generate(self, prompts, max_new_tokens, seed=0, with_log_probs=False, **kwargs):
        self.seeds.append(seed)
        out = []
        for i, p in enumerate(prompts):
            want = 1 + (seed + i) % (7 if p.numel() == 2 else 3)
            n = min(want, max_new_tokens)
            tokens = torch.full((n,), 5, dtype=torch.long)
            if n == want:
                tokens[-1] = EOS
            out.append(tokens)
        return (out, [torch.full((t.numel(),), -0.5) for t in out]) if with_log_probs else out


@pytest.fixture
def engines(monkeypatch):
    monkeypatch.setattr(iw, "CausalLMEngine", PassEngine)


def _trainer(*overrides):
    plan = build_configs(load_config(TINY, DAPO + list(PARTIAL) + list(overrides))).plan
    workers = []
    for rank in range(plan.layout.world_size):
        w = iw.IntegratedWorker(rank=rank, world_size=plan.layout.world_size, run_plan=plan)
        w.parallel_state = ParallelState.from_layout(rank, plan.layout)
        w.initialize("/unused", eos_id=EOS, pad_id=14)
        workers.append(w)
    trainer = dapo.RayDAPOTrainer(actor_worker=Group(workers), reward_list=[Reward()], run_plan=plan,
                                  dataset_additional_keys=["labels"], eos_id=EOS)
    return trainer, workers


def test_the_filter_keeps_varying_groups_of_the_pools_takes(engines):
    trainer, workers = _trainer()
    assert trainer.run_plan.partial is not None and trainer.run_plan.group_filter is not None
    assert trainer.run_plan.long_tail_lines()[0].endswith("takes of 8 complete prompts go to dynamic sampling's filter")
    data = batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    # a take is 8 complete groups, half of them odd (varying): two takes fill the 6 train groups
    assert m["dapo/rollout_batches"] == 2.0 and m["dapo/train_groups"] == 6.0 and m["dapo/batch_full"] == 1.0
    assert m["dapo/kept_groups"] == 8.0 and m["dapo/dropped_groups"] == 8.0
    assert m["partial_rollout/passes"] >= 2.0 and m["partial_rollout/max_passes"] == 2.0
    assert m["partial_rollout/continued_rows"] > 0  # rows longer than a pass's 5 tokens took two
    trained = _trained(workers)
    assert len(trained) == 18
    assert all((p[0] - 10 + p[1]) % 2 == 1 for p, _ in trained)  # odd labels only: the filter ran
    assert all(1 <= n <= 8 for _, n in trained)  # a whole response: one pass, or 5 tokens and up to 3 more
    assert len({p for p, _ in trained}) == 6


def test_iterations_continue_the_pool_and_count_what_they_drew(engines):
    trainer, workers = _trainer("megatron_training.train_iters=2")
    history = trainer.fit(batches(), start_iteration=0)
    assert [m["dapo/train_groups"] for m in history] == [6.0, 6.0]
    assert len(_trained(workers)) == 2 * 18
    prompts = [p for p, _ in _trained(workers)]
    assert len(set(prompts)) == 12  # no group trained twice
    # prompt batches drawn: the pool is topped up to 16 prompts before each take
    assert trainer.data_position == trainer.state_dict(2)["data_position"] >= 4


def test_max_batches_counts_takes(engines, capsys):
    trainer, workers = _trainer("rl_config.filter_groups_max_batches=1")
    data = batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    assert m["dapo/rollout_batches"] == 1.0 and m["dapo/train_groups"] == 4.0
    assert len(_trained(workers)) == 12 and "training on 4 of 6 groups" in capsys.readouterr().out
