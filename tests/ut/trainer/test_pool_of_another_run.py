"""A checkpoint's partial rollout pool is continued only when it is whole and this run's: every shape of damage
and a pool of another run (seed, data, tokenizer, batch or group size, pass budget) are refused in one line naming
the file, before anything is continued; a pool dropped because partial rollout is off is counted."""
import os
import re
import sys

import pytest
import torch

from mindspeed_rl.trainer import partial_rollout
from mindspeed_rl.trainer.modes import sync
from mindspeed_rl.trainer.utils.carry_pool import state_problem
from tests.ut.trainer.test_partial_rollout_step import Trainer


class Tok:
    def __init__(self, vocab, eos=0):
        self.vocab, self.eos_token_id = vocab, eos

    def get_vocab(self):
        return dict(self.vocab)


@pytest.fixture
def saved(tmp_path):
    """A pool after one iteration (rows carried), saved by a run of data 'toy:length' and a 3-token tokenizer."""
    t = Trainer()
    t.pool_identity = partial_rollout.pool_identity(t.run_plan, "toy:length", Tok({"a": 0, "b": 1, "c": 2}))
    sync.step(t, 1, next(t.data_iter))
    partial_rollout.save_pool(t, str(tmp_path))
    return t, str(tmp_path), os.path.join(str(tmp_path), partial_rollout.POOL_FILE)


def _again(*overrides, data="toy:length", tok=None):
    t = Trainer(*overrides)
    t.pool_identity = partial_rollout.pool_identity(t.run_plan, data, tok or Tok({"a": 0, "b": 1, "c": 2}))
    return t


def test_the_same_run_continues_its_pool(saved):
    t, folder, _ = saved
    again = _again()
    assert partial_rollout.load_pool(again, folder) == len(t.carry_pool.rows) > 0
    assert torch.load(os.path.join(folder, partial_rollout.POOL_FILE), weights_only=True)["run"] == {
        "rl_config.seed": 1234, "megatron_training.global_batch_size": 8, "rl_config.n_samples_per_prompt": 4,
        "rl_config.partial_rollout_max_split": 3, "generate_config.sampling_config.max_tokens": 10,
        "megatron_training.data_path": "toy:length", "tokenizer": again.pool_identity["tokenizer"],
        "rl_config.multi_turn_enable": False}


@pytest.mark.parametrize("overrides,data,tok,said", [
    (["rl_config.seed=7"], "toy:length", None, "its rl_config.seed=1234, this run's 7"),
    (["rl_config.n_samples_per_prompt=2", "rl_config.mini_batch_size=4"], "toy:length", None,
     "its rl_config.n_samples_per_prompt=4, this run's 2"),
    (["rl_config.partial_rollout_max_split=2"], "toy:length", None,
     "its rl_config.partial_rollout_max_split=3, this run's 2"),
    (["megatron_training.global_batch_size=16"], "toy:length", None,
     "its megatron_training.global_batch_size=8, this run's 16"),
    ([], "toy:sum", None, "its megatron_training.data_path='toy:length', this run's 'toy:sum'"),
    ([], "toy:length", Tok({"a": 0, "b": 2, "c": 1}), "its tokenizer='3 tokens, "),
])
def test_a_pool_of_another_run_is_refused_naming_the_file_and_the_key(saved, overrides, data, tok, said):
    _, folder, path = saved
    again = _again(*overrides, data=data, tok=tok)
    with pytest.raises(ValueError) as err:
        partial_rollout.load_pool(again, folder)
    text = str(err.value)
    assert text.startswith(f"partial rollout: {path} belongs to another run: ") and said in text
    assert text.endswith("continuing it would train that run's prompts and rows: resume with that run's "
                         "settings, or remove the file to start with an empty pool")
    assert again.carry_pool.rows == [] and again.rollout_passes == 0  # nothing was continued


def test_a_pool_saved_before_pools_recorded_their_run_is_continued_with_a_warning(saved, capsys):
    t, folder, path = saved
    state = torch.load(path, weights_only=True)
    del state["run"]
    torch.save(state, path)
    assert partial_rollout.load_pool(_again("rl_config.seed=7"), folder) == len(t.carry_pool.rows)
    assert capsys.readouterr().out == (f"warning: partial rollout: {path} does not record the run it belongs to "
                                       f"(saved before pools recorded it); its rows are continued unchecked\n")


def _damage(state, how):
    rows = state["rows"]
    if how == "a list":
        return list(rows)
    if how == "no rows":
        return {k: v for k, v in state.items() if k != "rows"}
    if how == "rows a dict":
        return dict(state, rows={0: rows[0]})
    if how == "n a string":
        return dict(state, n="4")
    if how == "passes missing":
        return dict(state, rollout_passes=None)
    if how == "passes a string":
        return dict(state, rollout_passes="3")
    row = dict(rows[1])
    if how == "row a list":
        row = list(row)
    elif how == "row without group":
        del row["group"]
    elif how == "float tokens":
        row["tokens"] = row["tokens"].float()
    elif how == "2-D prompt":
        row["prompt"] = row["prompt"].reshape(1, -1)
    elif how == "int log-probs":
        row["log_probs"] = row["log_probs"].long()
    elif how == "short log-probs":
        row["log_probs"] = row["log_probs"][:-1]
    elif how == "done an int":
        row["done"] = 1
    elif how == "negative passes":
        row["passes"] = -1
    elif how == "bool tokens":
        row["tokens"] = row["tokens"].bool()
    elif how == "list tokens":
        row["tokens"] = row["tokens"].tolist()
    elif how == "done missing a value":
        row["done"] = None
    elif how == "group at next":
        row["group"] = 16
    elif how == "too many tokens":
        row["tokens"] = torch.zeros(11, dtype=torch.int32)
        row["log_probs"], row["born"] = torch.zeros(11), torch.zeros(11, dtype=torch.int64)
    elif how == "group past next":
        row["group"] = 99
    return dict(state, rows=rows[:1] + [row] + rows[2:])


@pytest.mark.parametrize("how,problem", [
    ("a list", "it holds a list, not a pool (a dict)"),
    ("no rows", "it lacks 'rows'"),
    ("rows a dict", "its 'rows' is a dict, not a list"),
    ("n a string", "its 'n' is '4', not an int of at least 1"),
    ("passes missing", "its 'rollout_passes' is None, not an int"),
    ("passes a string", "its 'rollout_passes' is '3', not an int"),
    ("negative passes", "row 1's 'passes' is -1, not an int"),
    ("bool tokens", "row 1's 'tokens' is a 1-D torch.bool tensor, not a 1-D tensor of token ids"),
    ("list tokens", "row 1's 'tokens' is a list, not a 1-D tensor of token ids"),
    ("done missing a value", "row 1's 'done' is None, not true or false"),
    ("group at next", "row 1's group 16 is not below next_group=16"),
    ("row a list", "row 1 is a list, not a dict"),
    ("row without group", "row 1 lacks 'group'"),
    ("float tokens", "row 1's 'tokens' is a 1-D torch.float32 tensor, not a 1-D tensor of token ids"),
    ("2-D prompt", "row 1's 'prompt' is a 2-D torch.int32 tensor, not a 1-D tensor of token ids"),
    ("int log-probs", "row 1's 'log_probs' is a 1-D torch.int64 tensor, not a 1-D float tensor"),
    ("short log-probs", "row 1 has 8 tokens, 7 log-probs and 8 sampling iterations"),
    ("done an int", "row 1's 'done' is 1, not true or false"),
    ("too many tokens", "row 1 has 11 tokens, more than max_tokens=10"),
    ("group past next", "row 1's group 99 is not below next_group=16"),
])
def test_every_shape_of_damage_is_one_line_naming_the_file_and_nothing_is_continued(saved, how, problem):
    _, folder, path = saved
    torch.save(_damage(torch.load(path, weights_only=True), how), path)
    again = _again()
    with pytest.raises(ValueError) as err:
        partial_rollout.load_pool(again, folder)
    assert str(err.value) == (f"partial rollout: {path} is damaged: {problem}; nothing of it was continued (resume "
                              f"from another checkpoint, or remove the file to start with an empty pool)")
    assert again.carry_pool.rows == [] and again.rollout_passes == 0


def test_a_group_that_is_not_n_rows_is_damage_and_the_pools_own_load_checks_too(saved):
    t, _, _ = saved
    state = t.carry_pool.state_dict()
    assert state_problem(state) is None
    short = dict(state, rows=state["rows"][1:])
    assert state_problem(short) == "group 6 has 3 rows, not n=4"
    pool = _again().carry_pool
    with pytest.raises(ValueError, match=re.escape("partial rollout: the pool to continue is damaged: group 6 has 3 "
                                                   "rows, not n=4")):
        pool.load_state_dict(short)
    assert pool.rows == []


def test_a_pool_dropped_with_partial_rollout_off_is_counted(saved, tmp_path):
    t, folder, _ = saved
    rows = t.carry_pool.rows
    tokens = sum(r["tokens"].numel() for r in rows)
    assert tokens > 0
    assert partial_rollout.dropped_pool_line(folder) == (
        f"warning: partial rollout is off (rl_config.partial_rollout_max_split=1): the pool of {folder} is dropped: "
        f"{len({r['group'] for r in rows})} prompts in flight, {len(rows)} rows, {tokens} tokens made so far; their "
        f"prompts are not drawn again")
    assert partial_rollout.dropped_pool_line(str(tmp_path / "none")) is None


@pytest.mark.parametrize("key,value,problem", [
    ("n", 0, "its 'n' is 0, not an int of at least 1"),
    ("pass_tokens", 0, "its 'pass_tokens' is 0, not an int of at least 1"),
    ("max_tokens", 0, "its 'max_tokens' is 0, not an int of at least 1"),
    ("next_group", -1, "its 'next_group' is -1, not an int of at least 0"),
])
def test_the_pools_sizes_have_their_least_values(key, value, problem):
    least = {"rows": [], "next_group": 0, "n": 1, "max_tokens": 1, "pass_tokens": 1}
    assert state_problem(least) is None  # the smallest sizes a pool can have
    assert state_problem(dict(least, **{key: value})) == problem


def test_a_row_of_exactly_max_tokens_is_whole():
    row = {"group": 0, "prompt": torch.tensor([1, 2]), "extra": {}, "tokens": torch.zeros(3, dtype=torch.int32),
           "log_probs": torch.zeros(3), "born": torch.zeros(3, dtype=torch.int64), "passes": 1, "done": True}
    assert state_problem({"rows": [row], "next_group": 1, "n": 1, "max_tokens": 3, "pass_tokens": 3}) is None


def test_every_difference_from_this_run_is_named(saved):
    _, folder, path = saved
    again = _again("rl_config.seed=7", data="toy:sum")
    with pytest.raises(ValueError, match=re.escape("belongs to another run: its rl_config.seed=1234, this run's 7; "
                                                   "its megatron_training.data_path='toy:length', this run's "
                                                   "'toy:sum'; continuing")):
        partial_rollout.load_pool(again, folder)


def test_the_unchecked_pools_warning_is_flushed_at_once(saved, monkeypatch):
    from tests.ut.faults.test_reward_guard_edges import Stdout
    _, folder, path = saved
    state = torch.load(path, weights_only=True)
    del state["run"]
    torch.save(state, path)
    out = Stdout()
    monkeypatch.setattr(sys, "stdout", out)
    partial_rollout.load_pool(_again(), folder)
    assert "does not record the run it belongs to" in out.text and out.flushed == 1
