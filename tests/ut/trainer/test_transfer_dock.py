"""Upstream's pull API (compat.transfer_dock.PullDock, in-process) and the storage checks it shares
with the driver's dock."""
import pickle
import threading

import numpy as np
import pytest
import torch

from mindspeed_rl.compat.transfer_dock import PullDock as Dock
from mindspeed_rl.data.columnar import ColumnBatch
from mindspeed_rl.balance.seqlen_balancing import balance_stats, get_seqlen_balanced_partitions
from mindspeed_rl.balance.workload import WorkloadModel

COLS = ["responses", "prompt_length", "response_length"]


def _fill(td, prompts, n, seed=0, rows=None):
    """Put prompts and long-tail responses; returns per-row total lengths."""
    rng = np.random.default_rng(seed)
    plen = rng.integers(4, 64, prompts)
    td.put_prompts_experience({"prompts": [torch.ones(int(p), dtype=torch.int32) for p in plen]})
    difficulty = rng.lognormal(5, 1.0, prompts)
    resp = np.maximum(1, rng.lognormal(np.log(difficulty)[:, None], 0.5, (prompts, n))).astype(int).ravel()
    rows = list(range(prompts * n)) if rows is None else rows
    td.put_experience({"responses": [torch.ones(int(resp[r]), dtype=torch.int32) for r in rows],
                       "response_length": [torch.tensor([int(resp[r])]) for r in rows]}, rows)
    return np.repeat(plen, n) + resp


def _loads(total, shares):
    return np.array([total[s].sum() for s in shares])


def _round(td, consumer, count, balance, get_n_samples=True, max_calls=1000):
    """Requests until every row is consumed; a round that serves rows forever (a wrong row mapping) fails after
    ``max_calls`` requests instead of hanging."""
    shares = []
    for _ in range(max_calls):
        if td.all_consumed(consumer):
            return shares
        batch, idx = td.get_experience(consumer, COLS, count, get_n_samples=get_n_samples,
                                       use_batch_seqlen_balance=balance)
        assert batch is not None, "all rows are ready, a request must be served"
        assert len(batch["responses"]) == len(idx)
        shares.append(idx)
    pytest.fail(f"{consumer}: rows still unconsumed after {max_calls} requests (served: {shares[:4]}...)")


def test_balanced_round_serves_every_row_once_and_matches_offline():
    td = Dock(32, 4, timeout=1)
    total = _fill(td, 32, 4)
    shares = _round(td, "actor_train", 16, balance=True)
    flat = sorted(i for s in shares for i in s)
    assert flat == list(range(128))
    assert all(len(s) == 16 for s in shares)
    # groups stay whole on one share
    for s in shares:
        assert sorted({i // 4 for i in s}) == sorted(i // 4 for i in s[::4])
        assert all(sum(1 for i in s if i // 4 == g) == 4 for g in {i // 4 for i in s})
    group = total.reshape(32, 4).sum(1)
    offline = balance_stats(group, get_seqlen_balanced_partitions(group, 8, True))
    served = _loads(total, shares)
    assert served.max() / served.mean() - 1 == pytest.approx(offline["imbalance"])
    metrics = td.get_metrics().compute()
    assert metrics["dp_balance/actor_train/imbalance"] == pytest.approx(offline["imbalance"])
    assert metrics["dp_balance/actor_train/shares"] == 8
    history = td.get_balance_history()  # the plan's per-share loads, once
    assert sorted(history[-1]["loads"]) == pytest.approx(sorted(served)) and td.get_balance_history() == []


def test_balance_far_below_random_on_long_tail():
    imb = {}
    for balance in (True, False):
        td = Dock(64, 8, timeout=1)
        total = _fill(td, 64, 8, seed=3)
        loads = _loads(total, _round(td, "ref_log_prob", 64, balance))
        imb[balance] = loads.max() / loads.mean() - 1
    assert imb[True] < 0.02
    assert imb[False] > 5 * imb[True]


def test_one_plan_per_round():
    td = Dock(16, 2, timeout=1)
    _fill(td, 16, 2)
    calls = []
    original = get_seqlen_balanced_partitions

    import mindspeed_rl.balance.balance_plan as bp
    def counting(*args, **kwargs):
        calls.append(args[1])
        return original(*args, **kwargs)
    bp.get_seqlen_balanced_partitions, saved = counting, bp.get_seqlen_balanced_partitions
    try:
        _round(td, "actor_log_prob", 4, balance=True)
    finally:
        bp.get_seqlen_balanced_partitions = saved
    assert calls == [8]


def test_sample_level_balance_without_groups():
    td = Dock(8, 4, timeout=1)
    total = _fill(td, 8, 4, seed=5)
    shares = _round(td, "reward_scores", 8, balance=True, get_n_samples=False)
    assert sorted(i for s in shares for i in s) == list(range(32))
    loads = _loads(total, shares)
    assert loads.max() / loads.mean() - 1 < 0.05


def test_non_divisible_pool_serves_exact_shares_then_the_rest():
    # 10 groups, 3 groups per request -> every request gets the 3 it asks for while
    # the pool allows, the last one the single group left
    td = Dock(10, 2, timeout=1)
    total = _fill(td, 10, 2, seed=7)
    shares = _round(td, "actor_train", 6, balance=True)
    assert [len(s) // 2 for s in shares] == [3, 3, 3, 1]
    assert sorted(i for s in shares for i in s) == list(range(20))
    group = total.reshape(10, 2).sum(1)
    served = np.array([sum(group[i // 2] for i in s[::2]) for s in shares])
    unbalanced = [group[list(c)].sum() for c in np.array_split(np.arange(10), 4)]
    assert served.max() <= max(unbalanced)


def test_balance_off_for_consumers_not_in_mapper_and_when_flag_false():
    td = Dock(8, 2, timeout=1)
    _fill(td, 8, 2)
    _round(td, "grpo_metrics", 4, balance=True)
    assert "dp_balance/grpo_metrics/imbalance" not in td.get_metrics().metric
    _round(td, "actor_train", 4, balance=False)
    assert not any(k.startswith("dp_balance/") for k in td.get_metrics().metric)


def test_not_ready_returns_none_then_serves():
    td = Dock(4, 2, timeout=1)
    _fill(td, 4, 2, rows=[0, 1, 2, 3])
    assert td.get_experience("actor_train", COLS, 6, use_batch_seqlen_balance=True) == (None, None)
    batch, idx = td.get_experience("actor_train", COLS, 4, use_batch_seqlen_balance=True)
    assert sorted(idx) == [0, 1, 2, 3]


def test_short_final_batch_served_when_everything_left_is_ready():
    td = Dock(3, 2, timeout=1)
    _fill(td, 3, 2)
    _, first = td.get_experience("actor_train", COLS, 4)
    _, last = td.get_experience("actor_train", COLS, 4)
    assert len(first) == 4 and len(last) == 2
    assert td.all_consumed("actor_train")


def test_flops_objective_uses_workload_model():
    model = WorkloadModel(1.0, 0.01)
    td = Dock(8, 1, timeout=1, balance_objective="flops", workload_model=model)
    total = _fill(td, 8, 1, seed=9)
    shares = _round(td, "actor_train", 2, balance=True)
    costs = model.cost(total)
    served = np.array([costs[s].sum() for s in shares])
    offline = balance_stats(costs, get_seqlen_balanced_partitions(costs, 4, True))
    assert served.max() == pytest.approx(offline["max"])


def test_explicit_indexes_wait_and_time_out_with_names():
    td = Dock(2, 2, timeout=0.2, timeout_interval=0.01)
    _fill(td, 2, 2, rows=[0, 1])
    with pytest.raises(TimeoutError, match=r"consumer 'actor_train'.*'responses' rows \[2, 3\]"):
        td.get_experience("actor_train", ["responses"], indexes=[0, 1, 2, 3])


def test_explicit_indexes_wait_for_a_late_put():
    td = Dock(2, 1, timeout=5, timeout_interval=0.01)
    _fill(td, 2, 1, rows=[0])
    timer = threading.Timer(0.1, lambda: td.put_experience({"responses": [torch.ones(3)]}, [1]))
    timer.start()
    batch, idx = td.get_experience("actor_train", ["responses"], indexes=[1])
    timer.join()
    assert idx == [1] and batch["responses"][0].numel() == 3


@pytest.mark.parametrize("call,match", [
    (lambda td: td.get_experience("nobody", COLS, 2), "unknown consumer 'nobody'"),
    (lambda td: td.get_experience("actor_train", ["nope"], 2), r"unknown columns \['nope'\]"),
    (lambda td: td.get_experience("actor_train", COLS, 0), "positive int"),
    (lambda td: td.get_experience("actor_train", COLS, 99), "exceeds"),
    (lambda td: td.get_experience("actor_train", COLS, 3), "multiple of n_samples_per_prompt"),
    (lambda td: td.get_experience("actor_train", COLS, indexes=[8]), "row 8 is outside"),
    (lambda td: td.put_experience({"responses": [torch.ones(1)] * 2}, [0]), "has 2 rows but 1 indexes"),
    (lambda td: td.put_experience({"bogus": [torch.ones(1)]}, [0]), "unknown columns"),
    (lambda td: td.put_experience({"response_length": [torch.ones(2)]}, [0]), "one number per row"),
    (lambda td: td.put_experience({"responses": [torch.ones(1)]}, [-1]), "row -1 is outside"),
    (lambda td: td.all_consumed("ghost"), "unknown consumer"),
])
def test_bad_input_raises_and_leaves_state_unchanged(call, match):
    td = Dock(4, 2, timeout=1)
    _fill(td, 4, 2)
    before = ({k: v.clone() for k, v in td.experience_data_status.items()},
              {k: v.clone() for k, v in td.experience_consumer_status.items()},
              [t.clone() for t in td.experience_data["responses"]])
    with pytest.raises(ValueError, match=match):
        call(td)
    assert all(torch.equal(before[0][k], td.experience_data_status[k]) for k in before[0])
    assert all(torch.equal(before[1][k], td.experience_consumer_status[k]) for k in before[1])
    assert all(torch.equal(a, b) for a, b in zip(before[2], td.experience_data["responses"]))


def test_put_with_mismatched_columns_writes_nothing():
    td = Dock(2, 1, timeout=1)
    with pytest.raises(ValueError):
        td.put_experience({"responses": [torch.ones(2), torch.ones(2)],
                           "response_length": [torch.tensor([2])]}, [0, 1])
    assert int(td.experience_data_status["responses"].sum()) == 0
    assert td.experience_data["responses"][0] is None


def test_clear_resets_rows_consumers_plans_and_metrics():
    td = Dock(4, 2, timeout=1)
    _fill(td, 4, 2)
    _round(td, "actor_train", 4, balance=True)
    td.clear()
    assert not td.all_consumed("actor_train")
    assert int(td.experience_data_status["responses"].sum()) == 0
    assert td.get_metrics().metric == {}
    _fill(td, 4, 2, seed=1)
    assert len(_round(td, "actor_train", 4, balance=True)) == 2


def test_addition_columns_and_consumers_and_put_prompts_repeat():
    td = Dock(2, 3, addition_columns=["labels2"], addition_consumers=["critic"], timeout=1)
    td.put_prompts_experience({"prompts": [torch.tensor([1, 2]), torch.tensor([3])],
                               "labels2": [torch.tensor([7]), torch.tensor([8])]}, ["labels2"])
    batch, idx = td.get_experience("critic", ["prompts", "prompt_length", "labels2"], indexes=list(range(6)))
    # each prompt's n samples in consecutive rows (repeated, not tiled)
    assert [t.tolist() for t in batch["prompts"]] == [[1, 2]] * 3 + [[3]] * 3
    assert [int(t) for t in batch["prompt_length"]] == [2, 2, 2, 1, 1, 1]
    assert [int(t) for t in batch["labels2"]] == [7, 7, 7, 8, 8, 8]


def test_labels_sit_in_the_rows_of_the_responses_they_score():
    """Row r holds sample r % n of prompt r // n: its prompt and its label, so a
    reward reading (responses[r], labels[r]) scores each response against its own answer."""
    n = 4
    prompts = [torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 5, 6])]
    labels = [torch.tensor([70000]), torch.tensor([8, 9]), torch.tensor([10, 11, 12])]
    td = Dock(3, n, timeout=1)
    td.put_prompts_experience({"prompts": prompts, "labels": labels}, ["labels"])
    rows = list(range(3 * n))
    batch, idx = td.get_experience("rule_reward", ["prompts", "prompt_length", "labels"], indexes=rows)
    assert idx == rows
    for r in rows:
        assert batch["prompts"][r].tolist() == prompts[r // n].tolist(), f"row {r}"
        assert batch["labels"][r].tolist() == labels[r // n].tolist(), f"row {r}"
        assert int(batch["prompt_length"][r]) == prompts[r // n].numel(), f"row {r}"
    # a prompt's group read by the pull API keeps prompt and label together
    batch, idx = td.get_experience("reward_scores", ["prompts", "labels"], n)
    assert len({tuple(t.tolist()) for t in batch["labels"]}) == 1
    assert all(labels[i // n].tolist() == t.tolist() for i, t in zip(idx, batch["labels"]))
    with pytest.raises(ValueError, match="'labels' has 2 rows, prompts have 3"):
        td.put_prompts_experience({"prompts": prompts, "labels": labels[:2]}, ["labels"])


def test_token_ids_above_int16_range_are_stored_without_wrapping():
    """Vocabularies of 150k+ tokens: ids put as int64 (lists or a Ray-shipped
    ColumnBatch) come back unchanged."""
    ids = [torch.tensor([151643, 32768, 65535]), torch.tensor([2**31 - 1, 0, 40000])]
    td = Dock(2, 2, timeout=1)
    td.put_experience({"responses": ids}, [0, 1])  # lists: int64 narrowed to int32
    shipped = pickle.loads(pickle.dumps(ColumnBatch({"responses": ids, "input_ids": ids}), protocol=5))
    td.put_experience(shipped, [2, 3])  # as it arrives through Ray: one buffer per column
    batch, _ = td.get_experience("actor_train", ["responses"], indexes=[0, 1, 2, 3])
    assert [t.tolist() for t in batch["responses"]] == [t.tolist() for t in ids] * 2
    batch, _ = td.get_experience("actor_train", ["input_ids"], indexes=[2, 3])
    assert [t.tolist() for t in batch["input_ids"]] == [t.tolist() for t in ids]


def test_constructor_errors():
    with pytest.raises(ValueError, match="prompts_num"):
        Dock(0, 2)
    with pytest.raises(ValueError, match="objective"):
        Dock(2, 2, balance_objective="speed")
    with pytest.raises(ValueError, match="workload_model"):
        Dock(2, 2, balance_objective="flops")


def test_requests_of_another_shape_never_reuse_a_stale_plan():
    td = Dock(8, 4, timeout=1)
    _fill(td, 8, 4)
    _, first = td.get_experience("actor_train", COLS, 8, use_batch_seqlen_balance=True)   # groups plan
    _, second = td.get_experience("actor_train", COLS, 2, get_n_samples=False, use_batch_seqlen_balance=True)
    _, third = td.get_experience("actor_train", COLS, 8, use_batch_seqlen_balance=True)
    served = first + second + third
    assert len(served) == len(set(served)) == 18
    assert len(third) == 8


def test_rows_taken_outside_the_plan_trigger_a_new_plan():
    td = Dock(8, 2, timeout=1)
    _fill(td, 8, 2)
    _, first = td.get_experience("actor_train", COLS, 4, use_batch_seqlen_balance=True)
    # another share of that plan is taken by explicit indexes: the plan must not serve those rows again
    rest = sorted(set(range(16)) - set(first))
    _, taken = td.get_experience("actor_train", COLS, indexes=rest[:4])
    shares = _round(td, "actor_train", 4, balance=True)
    flat = first + taken + [i for s in shares for i in s]
    assert sorted(flat) == list(range(16))


def test_timed_out_index_request_consumes_nothing():
    td = Dock(2, 2, timeout=0.1, timeout_interval=0.01)
    _fill(td, 2, 2, rows=[0, 1])
    with pytest.raises(TimeoutError):
        td.get_experience("actor_train", ["responses"], indexes=[0, 1, 2, 3])
    assert int(td.experience_consumer_status["actor_train"].sum()) == 0


def _random_round(td, seed=0):
    """Same data every round; the seeded random split (balance off) of the whole round."""
    _fill(td, 8, 2, seed=seed)
    return _round(td, "actor_train", 4, balance=False)


def test_resumed_dock_continues_the_round_count():
    """A run resumed after iteration k draws the random splits of round k + 1,
    as the uninterrupted run does (the trainer calls set_round(k), then clear()
    before each iteration)."""
    straight = Dock(8, 2, timeout=1)
    straight.set_round(0)
    splits = []
    for _ in range(3):
        straight.clear()
        splits.append(_random_round(straight))
    assert splits[0] != splits[1] != splits[2]  # rounds draw differently, so a reset round shows
    resumed = Dock(8, 2, timeout=1)
    resumed.set_round(2)
    resumed.clear()
    assert _random_round(resumed) == splits[2]
    resumed.clear()
    again = Dock(8, 2, timeout=1)
    again.set_round(3)
    again.clear()
    assert _random_round(resumed) == _random_round(again)


def test_group_rows_lists_each_groups_rows_in_order():
    from mindspeed_rl.data.driver_dock import group_rows
    assert group_rows([2, 0], 3).tolist() == [6, 7, 8, 0, 1, 2]
    assert group_rows(torch.tensor([1]), 1).tolist() == [1]
    assert group_rows([], 4).tolist() == []
