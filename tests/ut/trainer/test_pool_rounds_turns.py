"""PoolRounds with a multi-turn pool, on stand-ins: each pass hands the pool the rows' turn columns (loss mask, tool
calls, turn state) with their responses; a single-turn pool gets none."""
from types import SimpleNamespace

import pytest

from mindspeed_rl.plan.stages import LOSS_MASK, ROLLOUT, ROLLOUT_LOG_PROBS, TOOL_CALLS
from mindspeed_rl.models.rollout.base import TURN_STATE
from mindspeed_rl.trainer.partial_rollout import PoolRounds

OUTPUTS = ("responses", "response_length", ROLLOUT_LOG_PROBS, LOSS_MASK, TOOL_CALLS, TURN_STATE)


class Pool:
    def __init__(self, turns):
        self.turns, self.groups, self.extended, self.complete = turns, 4, [], False

    def add(self, batch):
        pass

    def complete_groups(self):
        return [0, 1] if self.complete else []

    def pass_rows(self):
        return [5, 7]

    def pass_inputs(self, rows):
        return {"prompts": list(rows)}

    def pass_groups(self, rows):
        return [0], [0]

    def extend(self, rows, responses, log_probs, iteration, turns):
        self.extended.append((rows, responses, log_probs, iteration, turns))
        self.complete = True

    def take(self, count, iteration):
        return {"prompts": ["p"], ROLLOUT_LOG_PROBS: ["l"]}, {"partial_rollout/continued_rows": 0.0}


class Dock:
    experience_columns = ("prompts", "responses", ROLLOUT_LOG_PROBS)
    served = [0, 1]

    def __getattr__(self, name):  # set_round, clear, put_experience, set_queue_groups: nothing to check here
        return lambda *a, **k: None

    def rows_with(self, column):
        return list(self.served)

    def get_rows(self, columns, rows):
        return {c: [f"{c}:{r}" for r in rows] for c in columns}


def _rounds(turns, served=(0, 1)):
    spec = SimpleNamespace(train_prompts=2, pool_prompts=4, async_engine=False)
    plan = SimpleNamespace(partial=spec, stage=lambda name: SimpleNamespace(name=ROLLOUT.name, outputs=OUTPUTS))
    dock = Dock()
    dock.served = list(served)
    trainer = SimpleNamespace(run_plan=plan, carry_pool=Pool(turns), transfer_dock=dock, rollout_passes=0,
                              data_position=None, checked=lambda b: b, run_stages=lambda s, iteration: ({}, []))
    trainer.took_batch = lambda iteration: setattr(trainer, "data_position", 1)
    rounds = PoolRounds(trainer, 3, {"prompts": []})
    rounds.next_round()
    return trainer.carry_pool.extended


@pytest.mark.parametrize("turns", [True, False])
def test_a_pass_hands_the_pool_its_turn_columns_when_rows_are_conversations(turns):
    (rows, responses, log_probs, iteration, columns), = _rounds(turns)
    assert rows == [5, 7] and responses == ["responses:0", "responses:1"] and iteration == 3
    assert log_probs == [f"{ROLLOUT_LOG_PROBS}:0", f"{ROLLOUT_LOG_PROBS}:1"]
    if turns:
        assert columns == {c: [f"{c}:0", f"{c}:1"] for c in (LOSS_MASK, TOOL_CALLS, TURN_STATE)}
    else:
        assert columns is None


@pytest.mark.parametrize("multi_turn, turns", [(object(), True), (None, False)])
def test_a_multi_turn_runs_pool_keeps_turns(multi_turn, turns):
    from mindspeed_rl.trainer.partial_rollout import make_pool
    plan = SimpleNamespace(partial=SimpleNamespace(max_tokens=8, pass_tokens=4), n_samples=2, multi_turn=multi_turn)
    pool = make_pool(plan, 13, ["labels"])
    assert pool.turns is turns and (pool.n, pool.max_tokens, pool.pass_tokens, pool.eos_id) == (2, 8, 4, 13)


def test_a_pass_that_served_some_rows_hands_back_those_rows_only():
    # the pass's dock rows 0, 1 are pool rows 5, 7; only dock row 1 was served (a stopped pass)
    (rows, responses, log_probs, _, columns), = _rounds(True, served=(1,))
    assert rows == [7] and responses == ["responses:1"] and log_probs == [f"{ROLLOUT_LOG_PROBS}:1"]
    assert columns == {c: [f"{c}:1"] for c in (LOSS_MASK, TOOL_CALLS, TURN_STATE)}
