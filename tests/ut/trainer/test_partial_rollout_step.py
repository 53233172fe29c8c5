"""Partial rollout's iteration over a stand-in engine (no Ray): the pool's top-up, the passes until enough prompts
are complete, the rows a stopped pass did not serve, the train round's columns, and the pool in checkpoints."""
import dataclasses
from pathlib import Path

import pytest
import torch

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.plan.stages import ROLLOUT, ROLLOUT_BUDGET, ROLLOUT_LOG_PROBS
from mindspeed_rl.trainer import partial_rollout
from mindspeed_rl.trainer.modes import sync
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.data.driver_dock import DriverDock

TINY = Path(__file__).resolve().parents[3] / "configs" / "grpo_tiny_cpu.yaml"
EOS = 0


class Trainer:
    """The trainer's attributes the partial step uses; the rollout stage is a stand-in engine whose row with
    prompt [L, ...] makes tokens L, L, ... and ends (EOS) at L tokens; the train stages record their round."""
    took_batch = RayGRPOTrainer.took_batch

    def __init__(self, *overrides, serve=None):
        self.run_plan = build_configs(load_config(TINY, ["rl_config.partial_rollout_max_split=3", *overrides])).plan
        plan = self.run_plan
        self.transfer_dock = DriverDock(plan.dock_prompts, plan.n_samples, addition_columns=["labels"],
                                        run_plan=plan)
        self.carry_pool = partial_rollout.make_pool(plan, EOS, ["labels"])
        self.pool_identity = partial_rollout.pool_identity(plan)
        self.rollout_passes, self.data_position = 0, None
        self.serve = serve  # rows of a pass to serve (default: all)
        self.passes, self.trained = [], []
        self.data_iter = iter(self._batches())

    @staticmethod
    def _batches(limit=200):
        for k in range(limit):  # a step that never fills its pool fails here instead of drawing forever
            lengths = [(k * 8 + i) % 12 + 3 for i in range(8)]  # natural lengths 3..14 (10 is max_tokens)
            yield {"prompts": [torch.tensor([L, 20 + k], dtype=torch.int32) for L in lengths],
                   "labels": [torch.tensor([L]) for L in lengths]}
        raise AssertionError(f"the test's data ran out after {limit} prompt batches")

    def checked(self, batch):
        return batch

    def run_stages(self, stages, iteration):
        td = self.transfer_dock
        rows = list(range(td.round_rows()))
        if stages[0].name != ROLLOUT.name:
            self.trained.append(td.get_rows(["prompts", "responses", "response_length", "labels",
                                             ROLLOUT_LOG_PROBS], rows))
            return {"train": 1.0}, []
        got = td.get_rows(["prompts", ROLLOUT_BUDGET], rows)
        served = self.serve(rows) if self.serve else rows
        assert len(self.passes) < 200, "the step never completed enough prompts"  # fail, never hang
        self.passes.append((iteration, len(rows), len(served)))
        responses, log_probs = [], []
        for r in served:
            prompt, budget = got["prompts"][r], int(got[ROLLOUT_BUDGET][r])
            natural, made = int(prompt[0]), prompt.numel() - 2
            n = min(budget, natural - made)
            tokens = torch.full((n,), natural, dtype=torch.int32)
            if made + n == natural:
                tokens[-1] = EOS
            responses.append(tokens)
            log_probs.append(torch.full((n,), -0.01 * iteration))
        if served:
            td.put_experience({"responses": responses, "response_length": torch.tensor([t.numel() for t in responses]),
                               ROLLOUT_LOG_PROBS: log_probs}, served)
        return {"rollout": 1.0}, [{"rank": 0.0, "timing/actor_rollout": 1.0}]

    def finish_step(self, iteration, metrics, results, start):
        return dict(metrics, ranks=len(results))


def test_an_iteration_tops_up_the_pool_runs_passes_and_trains_complete_groups():
    t = Trainer()
    metrics = sync.step(t, 1, next(t.data_iter))
    assert t.data_position == 2  # the first batch and one more: the pool holds 2 x 8 prompts
    # passes of 4 tokens until 8 prompts have all 4 samples complete: lengths <= 4 after one, <= 8 after two
    assert [p[0] for p in t.passes] == [1, 2] and t.passes[0][1] == 64 and metrics["partial_rollout/passes"] == 2
    train = t.trained[0]
    assert len(train["prompts"]) == 32
    for prompt, response, length, label, lp in zip(train["prompts"], train["responses"], train["response_length"],
                                                    train["labels"], train[ROLLOUT_LOG_PROBS]):
        natural = int(prompt[0])
        assert prompt.numel() == 2 and int(label) == natural  # the original prompt, not its continuation
        assert response.numel() == int(length) == natural <= 8  # complete after two passes of 4
        assert int(response[-1]) == EOS and (response[:-1] == natural).all()
        # each token's log-prob as its pass made it
        assert lp.tolist() == pytest.approx([-0.01 * (1 + t_ // 4) for t_ in range(natural)])
    # the oldest complete groups train: the first batch's 6 prompts of lengths 3..8, the second's 3 and 4
    got = sorted((int(p[1]), int(p[0])) for p in train["prompts"][::4])
    assert got == [(20, L) for L in range(3, 9)] + [(21, 3), (21, 4)]
    assert metrics["partial_rollout/continued_rows"] == sum(int(L) > 4 for L in train["labels"])
    assert metrics["partial_rollout/carried_rows"] > 0  # rows longer than 8 wait for a third pass


def test_the_next_iteration_continues_the_carried_rows_first_and_rows_complete_within_n_passes():
    t = Trainer()
    for it in range(1, 5):
        sync.step(t, it, next(t.data_iter))
        t.data_iter = t.data_iter  # the same iterator: the step takes more only while a batch fits the pool
    for train in t.trained:
        for prompt, response in zip(train["prompts"], train["responses"]):
            assert response.numel() == min(int(prompt[0]), 10)  # complete: its end, or max_tokens
    assert max(r["passes"] for r in t.carry_pool.rows) <= 3
    assert all(len(train["prompts"]) == 32 for train in t.trained)


def test_a_stopped_pass_extends_only_the_rows_it_served():
    t = Trainer("rl_config.async_engine=true", serve=lambda rows: rows[: len(rows) // 2])
    before = [r["tokens"].numel() for r in t.carry_pool.rows]
    assert before == []
    sync.step(t, 1, next(t.data_iter))
    assert all(served == total // 2 for _, total, served in t.passes)
    assert len(t.trained[0]["prompts"]) == 32
    # each served row got its own tokens; unserved rows made nothing in that pass
    for prompt, response in zip(t.trained[0]["prompts"], t.trained[0]["responses"]):
        assert response.numel() == min(int(prompt[0]), 10) and (response[:-1] == int(prompt[0])).all()
    for row in t.carry_pool.rows:
        assert row["tokens"].numel() <= 4 * row["passes"] and (row["passes"] == 0) == (row["tokens"].numel() == 0)
    assert any(row["passes"] == 0 for row in t.carry_pool.rows)  # some rows were never served yet


def test_a_pass_that_serves_scattered_rows_puts_each_response_on_its_own_pool_row():
    def scattered(rows):  # every other row of the pass, the last first: never a prefix of the round
        return rows[1::2][::-1]
    t = Trainer("rl_config.async_engine=true", serve=scattered)
    made = []
    extend = t.carry_pool.extend

    def recording(indexes, responses, log_probs, iteration, turns=None):
        made.append(list(indexes))
        return extend(indexes, responses, log_probs, iteration, turns)
    t.carry_pool.extend = recording
    sync.step(t, 1, next(t.data_iter))
    assert all(served == total // 2 for _, total, served in t.passes) and len(t.passes) > 1
    assert any(indexes != list(range(len(indexes))) for indexes in made)  # pool rows past a prefix were served
    # every token a row holds is its own prompt's (prompt [L, ..] makes L, L, ..., EOS): none landed on another row
    for prompt, response in zip(t.trained[0]["prompts"], t.trained[0]["responses"]):
        assert response.numel() == min(int(prompt[0]), 10) and (response[:-1] == int(prompt[0])).all()
    for row in t.carry_pool.rows:
        tokens = row["tokens"][:-1] if row["done"] else row["tokens"]
        assert (tokens == int(row["prompt"][0])).all() and row["tokens"].numel() <= 4 * row["passes"]
        assert (row["passes"] == 0) == (row["tokens"].numel() == 0)


def test_the_pool_goes_into_the_checkpoint_and_comes_back(tmp_path):
    t = Trainer()
    sync.step(t, 1, next(t.data_iter))
    assert not partial_rollout.has_pool(str(tmp_path))
    partial_rollout.save_pool(t, str(tmp_path))
    assert partial_rollout.has_pool(str(tmp_path))
    again = Trainer()
    assert partial_rollout.load_pool(again, str(tmp_path)) == len(t.carry_pool.rows) > 0
    assert again.rollout_passes == t.rollout_passes == 2
    for a, b in zip(again.carry_pool.rows, t.carry_pool.rows):
        assert torch.equal(a["tokens"], b["tokens"]) and a["passes"] == b["passes"] and a["done"] == b["done"]
    assert partial_rollout.load_pool(Trainer(), str(tmp_path / "none")) == 0  # saved without partial rollout
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / partial_rollout.POOL_FILE).write_bytes(b"not a pool")
    with pytest.raises(ValueError, match="cannot read .*carry_pool.pt"):
        partial_rollout.load_pool(Trainer(), str(tmp_path / "bad"))


def test_batches_that_can_never_fill_an_iteration_stop_with_one_error():
    t = Trainer()
    t.data_iter = iter([{"prompts": [], "labels": []}])
    with pytest.raises(ValueError, match="prompt batch 2 holds no prompts"):
        sync.step(t, 1, {"prompts": [torch.tensor([3, 21], dtype=torch.int32)],
                                    "labels": [torch.tensor([3])]})
    t = Trainer()
    # a pool too small to hold an iteration's prompts
    t.run_plan = dataclasses.replace(t.run_plan, partial=dataclasses.replace(t.run_plan.partial, pool_prompts=8))
    with pytest.raises(RuntimeError, match="holds 1 prompts, all complete, fewer than the 8"):
        sync.step(t, 1, {"prompts": [torch.tensor([3, 21], dtype=torch.int32)],
                                    "labels": [torch.tensor([3])]})
