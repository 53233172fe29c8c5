"""cost_model: error messages, 2-D inputs, r2 corner cases, packed mode kept, fit edge cases, simulator details."""
import numpy as np
import pytest

from mindspeed_rl.balance.cost_model import (CostModel, micro_batch_features, prediction_error, r2_score,
                                           rank_features, simulate_step_time, split_groups)


def test_feature_messages():
    with pytest.raises(ValueError, match="^features is empty$"):
        CostModel(1, 1, 1).predict(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="^features hold a non-finite value$"):
        CostModel(1, 1, 1).predict([1.0, np.nan, 0.0])
    with pytest.raises(ValueError, match="^lengths_per_micro_batch is empty: no micro-batches given$"):
        micro_batch_features([])
    with pytest.raises(ValueError, match="^micro-batch 1 must hold finite, non-negative lengths$"):
        micro_batch_features([[1], [-1]])


def test_packed_mode_kept():
    assert rank_features([[2, 3], [4]], "packed").tolist() == [2.0, 9.0, 41.0]
    m = CostModel(0.0, 0.0, 1.0, "packed")
    assert m.micro_batch_cost([[2, 3]]) == 25.0
    assert (m + m).quadratic == "packed"
    assert m.scaled(2.0).quadratic == "packed"
    with pytest.raises(ValueError, match="^cannot add cost models with different quadratic terms$"):
        m + CostModel(0, 0, 1, "sequence")


def test_sample_cost_values_and_message():
    m = CostModel(5.0, 2.0, 0.5)
    assert m.sample_cost([4, 10]).tolist() == [16.0, 70.0]
    with pytest.raises(ValueError, match="^lengths must hold finite"):
        m.sample_cost([-1])


def test_r2_corners():
    assert r2_score([2, 2], [2, 2]) == 1.0
    assert r2_score([2, 2], [1, 3]) == 0.0
    assert r2_score([0.1, 0.2], [0.1, 0.25]) == pytest.approx(0.5)
    assert r2_score([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == pytest.approx(r2_score([1, 2, 3, 4], [1, 2, 3, 5]))
    assert r2_score([[1.0], [2.0], [4.0]], [1.0, 2.5, 4.0]) == pytest.approx(r2_score([1, 2, 4], [1, 2.5, 4]))
    with pytest.raises(ValueError, match="need equally long, non-empty arrays, got 2 and 1"):
        r2_score([1, 2], [1])


def test_prediction_error_column_seconds_and_zero():
    m = CostModel(0.0, 1.0, 0.0)
    feats = [[1, 2, 0], [1, 4, 0]]
    flat = prediction_error(m, feats, [2.0, 5.0])
    col = prediction_error(m, feats, [[2.0], [5.0]])
    assert col == flat
    assert flat["max_rel_err"] == pytest.approx(0.2)
    for bad in ([0.0, 5.0], [-1.0, 5.0]):
        with pytest.raises(ValueError, match="^relative errors need positive seconds$"):
            prediction_error(m, feats, bad)


def _feats(n=6):
    rng = np.random.default_rng(0)
    return np.column_stack([np.ones(n), rng.integers(10, 100, n), rng.integers(100, 10000, n)]).astype(float)


def test_fit_messages_and_minimum_rows():
    x = _feats(4)
    with pytest.raises(ValueError, match="^features have 4 rows but seconds has 3 values$"):
        CostModel.fit(x, [1, 2, 3])
    with pytest.raises(ValueError, match="^seconds hold a non-finite value$"):
        CostModel.fit(x, [1, 2, 3, np.inf])
    with pytest.raises(ValueError, match="got 2$"):
        CostModel.fit(x[:2], [1, 2])
    with pytest.raises(ValueError, match="^relative fit needs positive seconds$"):
        CostModel.fit(x, [1, 2, 0, 3], relative=True)
    true = np.array([0.5, 0.01, 0.001])
    m = CostModel.fit(x[:3], x[:3] @ true)  # three rows suffice
    assert [m.a, m.b, m.c] == pytest.approx(true.tolist(), rel=1e-6)


def test_fit_column_seconds_and_zero_column():
    x = _feats(6)
    x[:, 2] = 0.0  # no quadratic work at all
    y = x @ np.array([0.5, 0.02, 0.0])
    m = CostModel.fit(x, y.reshape(-1, 1))
    assert [m.a, m.b, m.c] == pytest.approx([0.5, 0.02, 0.0], rel=1e-6, abs=1e-12)
    assert np.isfinite(m.c)


def test_fit_nonneg_by_default():
    x = _feats(8)
    y = x @ np.array([1.0, 0.05, -0.0001])  # a negative quadratic term
    assert CostModel.fit(x, y, nonneg=False).c < 0
    assert CostModel.fit(x, y).c >= 0.0


def test_split_groups_checks():
    with pytest.raises(ValueError, match="^group_weights must hold finite"):
        split_groups([1, -1], 1, "heap")
    with pytest.raises(ValueError, match=r"^method must be one of \('off', 'heap', 'ours'\), got 'x'$"):
        split_groups([1, 2], 1, "x")
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match=f"^k must be a positive int, got {bad!r}$"):
            split_groups([1, 2], bad, "off")


def test_split_groups_default_seed_is_zero():
    w = list(range(1, 13))
    order = np.random.default_rng(0).permutation(12)
    want = [sorted(p.tolist()) for p in np.array_split(order, 3)]
    assert split_groups(w, 3, "off") == want


def test_simulate_checks():
    m = CostModel(0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="^lengths must hold finite"):
        simulate_step_time([1, -1], 1, "heap", 1, m)
    with pytest.raises(ValueError, match="^lengths is empty$"):
        simulate_step_time([], 1, "heap", 1, m)
    with pytest.raises(TypeError, match="^model must be a CostModel, got dict$"):
        simulate_step_time([1, 2], 1, "heap", 1, {})


def test_simulate_default_seed_and_ratio():
    lens = list(range(1, 25))
    m = CostModel(0.0, 0.001, 0.0)  # ideal below 1 second
    got = simulate_step_time(lens, 3, "off", 2, m)
    again = simulate_step_time(lens, 3, "off", 2, m, seed=0)
    assert got["partition"] == again["partition"]
    groups = np.asarray(lens, dtype=float).reshape(-1, 2).sum(axis=1)
    assert got["partition"] == split_groups(groups, 3, "off", 0)
    assert 0 < got["ideal"] < 1
    assert got["ratio"] == pytest.approx(got["step"] / got["ideal"])
    assert got["ratio"] > 1.0
    zero = simulate_step_time([0, 0, 0, 0], 2, "heap", 1, CostModel(0.0, 1.0, 0.0))
    assert zero["ideal"] == 0.0 and zero["ratio"] == 1.0


def test_simulate_objective_weights():
    # pairs with equal token sums but very different squares
    lens = [50, 50, 99, 1, 50, 50, 98, 2, 60, 40, 90, 10]
    m = CostModel(0.0, 1.0, 1.0)
    groups = np.asarray(lens, dtype=float).reshape(-1, 2)
    by_tokens = split_groups(groups.sum(axis=1), 2, "ours")
    by_cost = split_groups(m.sample_cost(lens).reshape(-1, 2).sum(axis=1), 2, "ours")
    assert by_tokens != by_cost
    assert simulate_step_time(lens, 2, "ours", 2, m)["partition"] == by_tokens
    assert simulate_step_time(lens, 2, "ours", 2, m, objective="cost")["partition"] == by_cost


def test_fit_relative_column_seconds():
    x = _feats(6)
    y = x @ np.array([0.5, 0.02, 0.0003])
    flat = CostModel.fit(x, y, relative=True)
    col = CostModel.fit(x, y.reshape(-1, 1), relative=True)
    assert [col.a, col.b, col.c] == pytest.approx([flat.a, flat.b, flat.c], rel=1e-9)


def test_synced_count_gives_empty_micro_batch():
    # the rank with one group pads to the synced count with an empty pass (cost a only)
    r = simulate_step_time([90, 90, 90], 2, "off", 1, CostModel(1.0, 1.0, 0.0), max_token_len=100,
                           sync_micro_batches=True)
    assert r["micro_batches"] == [2, 2]
    assert sorted(r["rank_costs"]) == [92.0, 182.0]
    assert sorted(r["micro_batch_lengths"]) == [[[90.0], []], [[90.0], [90.0]]]
