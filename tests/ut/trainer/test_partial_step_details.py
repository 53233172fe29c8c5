"""Partial rollout's iteration in detail (stand-in engine of test_partial_rollout_step.py): the dock's round
numbers, what each pass and the train stages are called with, the async stop rule, the queue's leftovers, a
run without rollout log-probs, and the pool file's errors."""
import re

import pytest
import torch

from mindspeed_rl.plan.stages import ROLLOUT, ROLLOUT_LOG_PROBS
from mindspeed_rl.trainer import partial_rollout
from mindspeed_rl.trainer.modes import sync
from mindspeed_rl.balance.rollout_queue import StopRule
from ut.trainer.test_partial_rollout_step import Trainer


class Recording(Trainer):
    def __init__(self, *overrides, serve=None, lengths=None):
        super().__init__(*overrides, serve=serve)
        self.rounds, self.calls, self.stops, self.finished = [], [], [], None
        if lengths is not None:
            self.data_iter = iter(self._fixed(lengths))

    @staticmethod
    def _fixed(lengths, limit=200):
        for k in range(limit):  # a step that never fills its pool fails here instead of drawing forever
            yield {"prompts": [torch.tensor([L, 20 + k], dtype=torch.int32) for L in lengths],
                   "labels": [torch.tensor([L]) for L in lengths]}
        raise AssertionError(f"the test's data ran out after {limit} prompt batches")

    def run_stages(self, stages, iteration):
        td = self.transfer_dock
        self.rounds.append(td.round)
        self.calls.append((stages[0].name, iteration))
        if stages[0].name == ROLLOUT.name:
            self.stops.append(td._queue_groups[2])
        if ROLLOUT_LOG_PROBS not in td.experience_columns:
            if stages[0].name == ROLLOUT.name:
                return self._serve_without_log_probs()
            self.trained.append(td.get_rows(["prompts", "responses"], list(range(td.round_rows()))))
            return {"train": 1.0}, []
        return super().run_stages(stages, iteration)

    def _serve_without_log_probs(self):
        td = self.transfer_dock
        rows = list(range(td.round_rows()))
        got = td.get_rows(["prompts", "rollout_budget"], rows)
        responses = []
        for r in rows:
            natural, made = int(got["prompts"][r][0]), got["prompts"][r].numel() - 2
            n = min(int(got["rollout_budget"][r]), natural - made)
            t = torch.full((n,), natural, dtype=torch.int32)
            if made + n == natural:
                t[-1] = 0
            responses.append(t)
        td.put_experience({"responses": responses, "response_length": torch.tensor([t.numel() for t in responses])},
                          rows)
        return {}, [{"rank": 0.0, "timing/actor_rollout": 1.0}]

    def finish_step(self, iteration, metrics, results, start):
        self.finished = (iteration, results, start)
        return super().finish_step(iteration, metrics, results, start)


def test_rounds_iterations_and_results_of_an_iteration():
    t = Recording()
    sync.step(t, 5, next(t.data_iter))
    # passes 1 and 2: rounds 2p + 1 (set to 2p, then cleared); the train round after them: 2 * 2 + 2
    assert t.rounds == [3, 5, 6] and t.transfer_dock.round == 6
    assert t.calls == [(ROLLOUT.name, 1), (ROLLOUT.name, 2), ("rule_reward", 5)]
    iteration, results, start = t.finished
    assert iteration == 5 and isinstance(start, float)
    # each pass's rank results add up (two passes of 1 s), then the train stages' (none here)
    assert results == [{"rank": 0.0, "timing/actor_rollout": 2.0}]
    assert t.stops == [None, None]  # sync passes have no stop rule
    sync.step(t, 6, next(t.data_iter))
    assert t.rounds[3] == 2 * 3 + 1  # the next pass continues the count


def test_exactly_enough_complete_prompts_end_the_passes():
    # lengths 1..4 and 5..8: after one pass of 4 tokens exactly 8 of the 16 prompts are complete
    t = Recording(lengths=[1, 2, 3, 4, 5, 6, 7, 8])
    metrics = sync.step(t, 1, next(t.data_iter))
    assert metrics["partial_rollout/passes"] == 1


def test_async_passes_carry_a_stop_rule_and_count_the_rows_left_in_the_queue():
    t = Recording("rl_config.async_engine=true", serve=lambda rows: rows[: len(rows) - 3])
    metrics = sync.step(t, 1, next(t.data_iter))
    assert all(isinstance(s, StopRule) for s in t.stops) and t.stops[0].need == 8
    assert metrics["partial_rollout/rows_left_in_queue"] == 3 * metrics["partial_rollout/passes"]
    assert "partial_rollout/rows_left_in_queue" not in sync.step(Recording(), 1, next(Recording().data_iter))


def test_a_run_without_rollout_log_probs_trains_without_them():
    t = Recording("rl_config.rollout_correction={rollout_is: null}")
    assert ROLLOUT_LOG_PROBS not in t.transfer_dock.experience_columns
    sync.step(t, 1, next(t.data_iter))
    assert t.calls[-1][0] == "rule_reward" and len(t.trained[0]["prompts"]) == 32


def test_the_pool_files_errors_name_the_file_and_the_cause(tmp_path):
    t = Trainer()
    with pytest.raises(RuntimeError, match=re.escape(f"saving the partial rollout pool into "
                                                     f"'{tmp_path / 'missing'}' failed: RuntimeError: ")):
        partial_rollout.save_pool(t, str(tmp_path / "missing"))
    (tmp_path / partial_rollout.POOL_FILE).write_bytes(b"not a pool")
    with pytest.raises(ValueError, match=r"cannot read .*carry_pool.pt: \w+Error: "):
        partial_rollout.load_pool(Trainer(), str(tmp_path))
