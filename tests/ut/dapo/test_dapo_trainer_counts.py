"""RayDAPOTrainer with dynamic sampling, what the other DAPO tests leave open: the rollout's per-rank counts over
several batches, a train round of exactly the fewest rows, the iteration in the balance records, a dataset key
no stage reads, and fit's default start. In-process workers and data of test_dapo_sampling."""
import json

import torch

import mindspeed_rl.workers.integrated_worker as iw
from mindspeed_rl.utils.loggers import BALANCE_FILE, MetricsLogger
from tests.ut.dapo.test_dapo_sampling import Engine, _trainer, _trained, batches, local  # noqa: F401 (fixture)


class CountingEngine(Engine):
    """Engine that also counts the tokens (prompt and response) of every row it generates."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generated_tokens = 0

    def generate(self, prompts, max_new_tokens, seed=0, **kwargs):
        responses = super().generate(prompts, max_new_tokens, seed=seed, **kwargs)
        self.generated_tokens += sum(p.numel() + r.numel() for p, r in zip(prompts, responses))
        return responses


def test_each_ranks_rollout_tokens_add_up_over_the_batches_drawn(local, monkeypatch):
    monkeypatch.setattr(iw, "CausalLMEngine", CountingEngine)
    trainer, workers = _trainer()
    data = batches()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    assert m["dapo/rollout_batches"] == 2.0
    for w in workers:  # both batches' rollouts on this rank, not the last one's alone
        assert m[f"tokens/actor_rollout/rank{w.rank}"] == float(w.actor.generated_tokens) > 0


def test_a_train_round_of_exactly_the_fewest_rows_is_trained(local):
    # 2 samples a prompt, 2 DP ranks with one train share each: 2 rows is the least a train round may hold
    trainer, workers = _trainer("rl_config.n_samples_per_prompt=2", "rl_config.filter_groups_max_batches=1")
    assert trainer.run_plan.min_train_rows == 2
    trainer.data_iter = batches()
    # one odd label: one group varies (its two samples get responses of different lengths)
    batch = next(batches())
    batch["labels"] = [torch.tensor([1 if j == 3 else 2]) for j in range(8)]
    m = trainer.step(1, batch)
    assert m["dapo/train_groups"] == 1.0 and m["dapo/batch_full"] == 0.0
    assert sorted(p for p, _ in _trained(workers)) == [(10, 3), (10, 3)]


def test_the_balance_records_name_the_iteration_that_made_them(local, tmp_path):
    trainer, _ = _trainer()
    trainer.logger = MetricsLogger(output_dir=str(tmp_path))
    data = batches()
    trainer.data_iter = data
    trainer.step(3, next(data))
    trainer.logger.close()
    records = [json.loads(line) for line in (tmp_path / BALANCE_FILE).read_text().splitlines()]
    assert records and {r["iteration"] for r in records} == {3}


def test_a_dataset_key_no_stage_reads_still_goes_into_the_dock(local):
    trainer, workers = _trainer()
    trainer.dataset_additional_keys = ["labels", "source"]
    trainer.transfer_dock_init()
    assert "source" in trainer.transfer_dock.experience_columns

    def with_source():
        for batch in batches():
            batch["source"] = [torch.tensor([7]) for _ in batch["prompts"]]
            yield batch

    data = with_source()
    trainer.data_iter = data
    m = trainer.step(1, next(data))
    assert m["dapo/train_groups"] == 6.0 and len(_trained(workers)) == 18


def test_fit_without_a_start_iteration_runs_from_the_first_iteration(local):
    trainer, _ = _trainer("megatron_training.train_iters=2")
    history = trainer.fit(batches())
    assert len(history) == 2 and trainer.data_position == 4
    assert trainer.state_dict(2)["iteration"] == 2
