"""DAPO dynamic sampling in-process: an in-process dock, two IntegratedWorkers
(DP ranks 0 and 1, no process group) with a recording engine, the real trainer step.

The reward makes every group whose label is even all-equal (1.0) and every odd
group vary (the response length); the engine's response lengths follow the
rollout seed, so refills sample afresh."""
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import mindspeed_rl.trainer.dapo_trainer_hybrid as dapo
import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import FILTER, REF, TRAIN
from mindspeed_rl.balance.rollout_queue import RolloutQueue
from mindspeed_rl.workers.parallel_state import ParallelState

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"
# 8 prompts a rollout batch, 3 samples, 2 DP ranks; the train batch is 6 groups (18 rows, one mini-batch)
DAPO = ["megatron_training.model_path=/unused", "megatron_training.stage=ray_dapo",
        "rl_config.n_samples_per_prompt=3", "rl_config.mini_batch_size=6", "actor_config.micro_batch_size=1",
        "rl_config.filter_groups_enable=true", "rl_config.filter_groups_metric=length_match",
        "rl_config.filter_groups_train_batch_size=6", "rl_config.filter_groups_max_batches=5"]


class Engine:
    """Stands in for CausalLMEngine: response lengths follow the seed; records trained prompts."""

    def __init__(self, *args, **kwargs):
        self.trained, self.seeds = [], []

    def generate(self, prompts, max_new_tokens, seed=0, **kwargs):
        self.seeds.append(seed)
        return [torch.full((1 + (seed + i) % 7,), 5, dtype=torch.long) for i in range(len(prompts))]

    def log_probs(self, prompts, responses, micro_batches, with_entropy=False, temperature=1.0):
        return [torch.full((r.numel(),), -1.0) for r in responses], None

    def train_step(self, prompts, responses, micro_batches, loss_fn, token_count, dp_size=1, **kwargs):
        self.trained.append([(tuple(prompts[i].tolist()), responses[i].numel()) for mb in micro_batches for i in mb])
        return {"actor/pg_loss": 0.0}


class Reward:
    """Even label: 1.0 for every sample (the group is dropped); odd: the response length."""

    def __call__(self, responses, labels):
        scores = torch.tensor([1.0 if int(l[0]) % 2 == 0 else float(r.numel()) for r, l in zip(responses, labels)])
        self.last_scores = {"length_match": scores}
        return scores


class TurnQueue(RolloutQueue):
    """A rollout queue whose consumers take in turns (0, 1, ..., 0, ...; a drained one leaves the turn): the
    engines of an in-process group run in threads as if at the same speed, so who makes which row is fixed.
    A repeated take (a TP peer's) is answered at once."""

    def __init__(self):
        super().__init__()
        self.turn, self.active, self.lock = 0, [], threading.Condition()

    def load(self, *args, **kwargs):
        out = super().load(*args, **kwargs)
        self.turn, self.active = 0, list(range(self.consumers))
        return out

    def take(self, key, consumer, seq, want, progress=None, turns=None):
        with self.lock:
            if (consumer, seq) in self._takes:
                return super().take(key, consumer, seq, want, progress, turns)
            assert self.lock.wait_for(lambda: self.active[self.turn % len(self.active)] == consumer, timeout=60)
            rows = super().take(key, consumer, seq, want, progress, turns)
            if rows:
                self.turn += 1
            else:
                self.active.remove(consumer)
            self.lock.notify_all()
            return rows


class Group:
    """The worker group in-process, as the launcher sends a stage group: each rank its DP rank's rows;
    every rank's metrics and the TP sources' outputs. A queued stage runs every rank in a thread on a
    TurnQueue."""

    def __init__(self, workers):
        self.workers = workers
        self.queue = TurnQueue()

    def run_stage(self, group, plan, batches, **context):
        results = [w.run_stage(group, plan, batches[w.parallel_state.dp_rank], **context) for w in self.workers]
        return ([m for m, _ in results],
                [out for w, (_, out) in zip(self.workers, results) if w.parallel_state.tp_rank == 0])

    def run_queued_stage(self, group, queued, **context):
        plan = self.workers[0].run_plan
        chunk, cap = plan.rollout_takes(plan.stages[group.names[0]])
        self.queue.load(1, len(queued.order), plan.rollout_consumers, chunk, cap, queued.groups, queued.prior)
        with ThreadPoolExecutor(len(self.workers)) as pool:
            replies = list(pool.map(lambda w: w.run_queued_stage(group, queued.order, queued.batch, self.queue, 1,
                                                                 **context), self.workers))
        return [m for m, _, _ in replies], [(out, trace) for _, out, trace in replies if out is not None]


def batches(start=0, size=8, limit=500):
    """Prompt batch k: prompts [k, j] with labels cycling 0..3 (half the groups odd); at most ``limit`` batches (a
    filter that never fills fails instead of drawing forever)."""
    for k in range(start, start + limit):
        yield {"prompts": [torch.tensor([10 + k, j]) for j in range(size)],
               "labels": [torch.tensor([(k + j) % 4]) for j in range(size)]}
    raise AssertionError(f"the test's data ran out after {limit} prompt batches")


@pytest.fixture
def local(monkeypatch):
    monkeypatch.setattr(iw, "CausalLMEngine", Engine)


def workers_of(plan, cls=None):
    """One in-process worker per rank of ``plan`` (no process group), started on the stand-in engine."""
    workers = []
    for rank in range(plan.layout.world_size):
        w = (cls or iw.IntegratedWorker)(rank=rank, world_size=plan.layout.world_size, run_plan=plan)
        w.parallel_state = ParallelState.from_layout(rank, plan.layout)
        w.initialize("/unused", eos_id=13, pad_id=14)
        workers.append(w)
    return workers


def _trainer(*overrides, data_position=None):
    cfgs = build_configs(load_config(TINY, DAPO + list(overrides)))
    plan = cfgs.plan
    workers = workers_of(plan)
    trainer = dapo.RayDAPOTrainer(actor_worker=Group(workers), reward_list=[Reward()], run_plan=plan,
                      dataset_additional_keys=["labels"], init_kl_coef=cfgs.rl_config.init_kl_coef,
                      data_position=data_position)
    return trainer, workers


def _trained(workers):
    return [row for w in workers for step in w.actor.trained for row in step]


def test_all_equal_groups_are_dropped_and_batches_refill(local):
    trainer, workers = _trainer()
    data = batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    # each batch of 8 prompts has 4 odd (kept) groups: 2 batches fill the 6 groups, the surplus 2 are dropped
    assert m["dapo/rollout_batches"] == 2 and m["dapo/extra_rollout_batches"] == 1
    assert m["dapo/kept_groups"] == 8 and m["dapo/dropped_groups"] == 8 and m["dapo/train_groups"] == 6
    assert m["dapo/batch_full"] == 1.0 and trainer.data_position == 2
    trained = _trained(workers)
    assert len(trained) == 18
    # only groups with an odd label were trained: prompt [10 + k, j] has label (k + j) % 4
    assert all((p[0] - 10 + p[1]) % 2 == 1 for p, _ in trained)
    # the first batch's 4 kept groups and the first 2 of the second, in order
    assert sorted({p for p, _ in trained}) == sorted([(10, 1), (10, 3), (10, 5), (10, 7), (11, 0), (11, 2)])
    assert trainer.state_dict(1) == {"iteration": 1, "kl_coef": trainer.kl_ctrl.value, "data_position": 2,
                                     "algorithm": trainer.algorithm}
    # the refill samples with seeds of its own (each share's seed follows the batch, not the iteration)
    seeds = [s for w in workers for s in w.actor.seeds]
    assert len(seeds) == 4 and len(set(seeds)) == 4


def test_max_batches_trains_on_what_is_kept_and_says_so(local, capsys):
    trainer, workers = _trainer("rl_config.filter_groups_max_batches=1")
    data = batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    assert m["dapo/rollout_batches"] == 1 and m["dapo/train_groups"] == 4 and m["dapo/batch_full"] == 0.0
    assert len(_trained(workers)) == 12
    assert "training on 4 of 6 groups" in capsys.readouterr().out


def test_too_few_kept_rows_is_an_error_naming_the_key(local):
    trainer, _ = _trainer("rl_config.filter_groups_max_batches=1")
    trainer.data_iter = batches()
    with pytest.raises(RuntimeError, match="filter_groups_max_batches=1"):
        # every label even: nothing varies
        trainer.step(1, {"prompts": [torch.tensor([1, j]) for j in range(8)],
                         "labels": [torch.tensor([2]) for _ in range(8)]})


@pytest.mark.parametrize("kept", [5, 3])
def test_filtered_non_divisible_round_is_balanced_and_every_row_trained_once(local, kept):
    # 5 kept groups = 15 rows into 2 ranks x 1 share (8 and 7); 3 groups = 9 rows (5 and 4), though a
    # full share is 9 rows; no row twice, none missed
    trainer, workers = _trainer("rl_config.filter_groups_max_batches=1", "rl_config.init_kl_coef=0.01")
    data = batches()
    trainer.data_iter = data
    batch = next(data)
    if kept == 5:
        batch["labels"][0] = torch.tensor([1])
    else:
        batch["labels"][1] = torch.tensor([0])
    trainer.step(1, batch)
    n_rows = 3 * kept
    for name in (REF.name, TRAIN.name):
        plan = trainer.transfer_dock.plan_stage(name)
        sizes = [len(share) for rank in plan for share in rank]
        assert len(plan) == 2 and all(len(rank) == 1 for rank in plan), name
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n_rows, (name, sizes)
        rows = sorted(r for rank in plan for share in rank for r in share)
        assert rows == list(range(n_rows)), name
    trained = _trained(workers)
    dock = trainer.transfer_dock
    rows = [(tuple(dock.experience_data["prompts"][r].tolist()), int(dock.experience_lengths["response_length"][r]))
            for r in range(n_rows)]
    assert sorted(trained) == sorted(rows)  # each kept row trained once
    assert len({p for p, _ in trained}) == kept
    # balanced by tokens: the two ranks' train loads differ by at most the longest row
    lengths = trainer.transfer_dock.experience_lengths
    cost = (lengths["prompt_length"] + lengths["response_length"])[:n_rows]
    loads = [sum(int(cost[r]) for share in rank for r in share) for rank in trainer.transfer_dock.plan_stage(TRAIN.name)]
    assert abs(loads[0] - loads[1]) <= int(cost.max())


def test_data_position_resumes_exactly_after_a_refilled_iteration(local):
    straight, _ = _trainer()
    data = batches()
    straight.data_iter = data
    straight.step(1, next(data))
    position = straight.state_dict(1)["data_position"]
    after = straight.step(2, next(data))
    # resume: the CLI positions the data iterator at the checkpoint's data position
    resumed, workers = _trainer(data_position=position)
    data2 = batches(start=position)
    resumed.data_iter = data2
    again = resumed.step(2, next(data2))
    keys = ("dapo/rollout_batches", "dapo/kept_groups", "dapo/train_groups", "reward/mean")
    assert [after[k] for k in keys] == [again[k] for k in keys]
    assert resumed.data_position == straight.data_position
    got = sorted(_trained(workers))
    want = sorted(r for w in straight.groups["actor"].workers for step in w.actor.trained[-1:] for r in step)
    assert got == want


def test_filter_stage_carries_what_the_train_stages_read(local):
    trainer, _ = _trainer("rl_config.init_kl_coef=0.01")
    stage = trainer.run_plan.stage(FILTER.name)
    assert set(stage.inputs) >= {"metric_for_dapo", "prompts", "responses", "advantages"}
    assert "ref_log_prob" not in stage.inputs  # made by the train stages themselves
