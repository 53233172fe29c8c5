import numpy as np
import pytest

from mindspeed_rl.balance.cost_model import (CostModel, micro_batch_features, prediction_error, r2_score,
                                           rank_features, simulate_step_time, split_groups)


def _synthetic(rng, m, coef, noise=0.02, quadratic="sequence"):
    """Random micro-batches and their seconds under ``coef``, with relative noise."""
    # log-uniform lengths 4..4096: short micro-batches pin the per-pass term
    mbs = [np.rint(np.exp(rng.uniform(np.log(4), np.log(4096), rng.integers(1, 5)))).tolist() for _ in range(m)]
    x = micro_batch_features(mbs, quadratic)
    y = x @ np.asarray(coef) * (1 + noise * rng.standard_normal(m))
    return x, y


def _long_tail(rng, prompts, n, cap=8192):
    """GRPO-like lengths: per-prompt lognormal difficulty, capped responses."""
    mu = np.log(1200.0) + 0.8 * rng.standard_normal(prompts)
    resp = np.minimum(rng.lognormal(mu[:, None], 0.6, (prompts, n)), cap)
    prompt = rng.integers(64, 1024, (prompts, 1))
    return np.rint(resp + prompt).astype(int).reshape(-1)


# ---------------------------------------------------------------- features


def test_features_hand_example():
    x = micro_batch_features([[3, 4], [10], []])
    np.testing.assert_allclose(x, [[1, 7, 25], [1, 10, 100], [1, 0, 0]])
    packed = micro_batch_features([[3, 4], [10]], quadratic="packed")
    np.testing.assert_allclose(packed, [[1, 7, 49], [1, 10, 100]])
    np.testing.assert_allclose(rank_features([[3, 4], [10], []]), [3, 17, 125])


def test_rank_cost_is_sum_of_micro_batch_costs():
    model = CostModel(0.5, 0.01, 1e-4)
    mbs = [[3, 4], [10]]
    per_mb = model.predict(micro_batch_features(mbs))
    assert model.micro_batch_cost(mbs) == pytest.approx(per_mb.sum())
    assert model.micro_batch_cost(mbs) == pytest.approx(2 * 0.5 + 17 * 0.01 + 125 * 1e-4)


def test_features_bad_input():
    with pytest.raises(ValueError, match="empty"):
        micro_batch_features([])
    with pytest.raises(ValueError, match="non-negative"):
        micro_batch_features([[3, -1]])
    with pytest.raises(ValueError, match="flat"):
        micro_batch_features([[[1, 2]]])
    with pytest.raises(ValueError, match="quadratic"):
        micro_batch_features([[1]], quadratic="dense")


# ---------------------------------------------------------------- fit


@pytest.mark.parametrize("quadratic", ["sequence", "packed"])
def test_fit_recovers_known_coefficients(quadratic):
    rng = np.random.default_rng(0)
    coef = [2e-3, 5e-5, 3e-8]
    x, y = _synthetic(rng, 400, coef, noise=0.02, quadratic=quadratic)
    # relative weighting recovers all three (noise is relative)
    model = CostModel.fit(x, y, relative=True, quadratic=quadratic)
    assert model.quadratic == quadratic
    np.testing.assert_allclose(model.coef, coef, rtol=0.1)
    # the absolute fit is dominated by large micro-batches: b and c still recovered
    np.testing.assert_allclose(CostModel.fit(x, y, quadratic=quadratic).coef[1:], coef[1:], rtol=0.1)


def test_fit_without_noise_is_exact_and_unconstrained_matches():
    rng = np.random.default_rng(1)
    coef = [1e-3, 2e-5, 4e-9]
    x, y = _synthetic(rng, 50, coef, noise=0.0)
    np.testing.assert_allclose(CostModel.fit(x, y).coef, coef, rtol=1e-6)
    np.testing.assert_allclose(CostModel.fit(x, y, nonneg=False).coef, coef, rtol=1e-6)


def test_fit_keeps_coefficients_non_negative():
    rng = np.random.default_rng(2)
    x, _ = _synthetic(rng, 200, [0, 0, 0])
    # seconds fall with the per-pass column: the free fit gives a < 0, nnls clips it
    y = 1e-4 * x[:, 1] - 0.05 + 0.001 * rng.standard_normal(200)
    free = CostModel.fit(x, y, nonneg=False)
    assert free.a < 0
    model = CostModel.fit(x, y, nonneg=True)
    assert min(model.coef) >= 0


def test_held_out_error_metric():
    rng = np.random.default_rng(3)
    coef = [2e-3, 5e-5, 3e-8]
    x_tr, y_tr = _synthetic(rng, 200, coef, noise=0.03)
    x_te, y_te = _synthetic(rng, 100, coef, noise=0.03)
    err = prediction_error(CostModel.fit(x_tr, y_tr, relative=True), x_te, y_te)
    assert err["n"] == 100
    assert err["r2"] > 0.98
    assert err["mean_rel_err"] < 0.05
    assert err["max_rel_err"] >= err["mean_rel_err"]
    assert err["total_rel_err"] < 0.02
    # a wrong model is measurably worse
    bad = prediction_error(CostModel(*np.asarray(coef) * 2), x_te, y_te)
    assert bad["mean_rel_err"] > 0.5 and bad["r2"] < err["r2"]


def test_r2_score():
    assert r2_score([1, 2, 3], [1, 2, 3]) == 1.0
    assert r2_score([1, 2, 3], [2, 2, 2]) == pytest.approx(0.0)
    with pytest.raises(ValueError):
        r2_score([], [])
    with pytest.raises(ValueError):
        r2_score([1, 2], [1])


def test_fit_bad_input():
    x = micro_batch_features([[1], [2], [3], [4]])
    with pytest.raises(ValueError, match="rows"):
        CostModel.fit(x, [1.0, 2.0])
    with pytest.raises(ValueError, match="3 columns"):
        CostModel.fit(np.ones((4, 2)), np.ones(4))
    with pytest.raises(ValueError, match="empty"):
        CostModel.fit(np.zeros((0, 3)), [])
    with pytest.raises(ValueError, match="at least 3"):
        CostModel.fit(x[:2], [1.0, 2.0])
    with pytest.raises(ValueError, match="non-finite"):
        CostModel.fit(x, [1.0, np.nan, 2.0, 3.0])
    with pytest.raises(ValueError, match="positive"):
        CostModel.fit(x, [1.0, 0.0, 2.0, 3.0], relative=True)
    with pytest.raises(ValueError, match="rows"):
        prediction_error(CostModel(1, 1, 1), x, [1.0])
    with pytest.raises(ValueError, match="quadratic"):
        CostModel(1, 1, 1, quadratic="dense")
    with pytest.raises(ValueError, match="different"):
        CostModel(1, 1, 1) + CostModel(1, 1, 1, quadratic="packed")


def test_add_and_scale():
    m = CostModel(1, 2, 3) + CostModel(0.5, 0.5, 0.5).scaled(2)
    np.testing.assert_allclose(m.coef, [2, 3, 4])


# ---------------------------------------------------------------- simulation


MODEL = CostModel(a=1e-3, b=2e-5, c=2e-9)


@pytest.mark.parametrize("max_token_len", [None, 16384])
def test_simulate_ours_beats_heap_beats_off_on_long_tail(max_token_len):
    k, n, per_rank = 8, 8, 4
    steps = {m: [] for m in ("off", "heap", "ours")}
    for seed in range(6):
        lens = _long_tail(np.random.default_rng(seed), k * per_rank, n)
        for m in steps:
            out = simulate_step_time(lens, k, m, n, MODEL, max_token_len=max_token_len, seed=seed)
            assert out["ideal"] <= out["step"] * (1 + 1e-12)
            assert out["ratio"] >= 1.0 - 1e-12
            assert len(out["rank_costs"]) == k
            assert sorted(g for p in out["partition"] for g in p) == list(range(k * per_rank))
            assert {len(p) for p in out["partition"]} == {per_rank}
            steps[m].append(out["step"])
    mean = {m: np.mean(v) for m, v in steps.items()}
    assert mean["ours"] <= mean["heap"] <= mean["off"]
    assert mean["off"] / mean["ours"] > 1.1


def test_simulate_step_is_max_and_ideal_is_mean():
    lens = [10, 10, 50, 50, 20, 20, 30, 30]
    model = CostModel(0, 1, 0)  # cost == tokens
    out = simulate_step_time(lens, 2, "ours", 2, model)
    assert out["rank_costs"] == [120.0, 100.0] or sorted(out["rank_costs"]) == [100.0, 120.0]
    assert out["step"] == 120.0 and out["ideal"] == 110.0
    assert out["micro_batches"] == [4, 4]
    # micro-batches under a token cap: each rank packs its 4 samples
    packed = simulate_step_time(lens, 2, "ours", 2, CostModel(1, 0, 0), max_token_len=200)
    assert packed["micro_batches"] == [1, 1]


def test_simulate_sync_gives_every_rank_the_largest_count():
    # five 60s under a 100-token cap need 5 micro-batches; 30, 30, 30, 20, 10 need 2
    lens = [60, 60, 60, 60, 60, 30, 30, 30, 20, 10]
    model = CostModel(1, 0, 0, quadratic="packed")
    free = simulate_step_time(lens, 2, "heap", 5, model, max_token_len=100)
    assert sorted(free["micro_batches"]) == [2, 5]
    synced = simulate_step_time(lens, 2, "heap", 5, model, max_token_len=100, sync_micro_batches=True)
    assert synced["micro_batches"] == [5, 5]
    assert synced["step"] == synced["ideal"] == 5.0
    for mbs in synced["micro_batch_lengths"]:
        assert all(sum(mb) <= 100 for mb in mbs)


def test_simulate_cost_objective():
    rng = np.random.default_rng(7)
    lens = _long_tail(rng, 32, 8)
    quad = CostModel(0, 0, 1e-6)  # pure L^2 cost: balancing on cost beats balancing tokens
    by_cost = np.mean([simulate_step_time(lens, 8, "ours", 8, quad, objective="cost")["ratio"]])
    by_tokens = np.mean([simulate_step_time(lens, 8, "ours", 8, quad, objective="tokens")["ratio"]])
    assert by_cost <= by_tokens + 1e-9


def test_off_split_is_seeded():
    w = np.arange(16)
    assert split_groups(w, 4, "off", seed=3) == split_groups(w, 4, "off", seed=3)
    assert split_groups(w, 4, "off", seed=3) != split_groups(w, 4, "off", seed=4)


def test_simulate_bad_input():
    with pytest.raises(ValueError, match="empty"):
        simulate_step_time([], 2, "ours", 2, MODEL)
    with pytest.raises(ValueError, match="whole groups"):
        simulate_step_time([1, 2, 3], 1, "ours", 2, MODEL)
    with pytest.raises(ValueError, match="method"):
        simulate_step_time([1, 2, 3, 4], 2, "random", 1, MODEL)
    with pytest.raises(ValueError, match="cannot fill"):
        simulate_step_time([1, 2, 3, 4], 3, "ours", 2, MODEL)
    with pytest.raises(ValueError, match="n_samples"):
        simulate_step_time([1, 2], 1, "ours", 0, MODEL)
    with pytest.raises(ValueError, match="objective"):
        simulate_step_time([1, 2], 1, "ours", 1, MODEL, objective="flops")
    with pytest.raises(TypeError):
        simulate_step_time([1, 2], 1, "ours", 1, (1, 2, 3))
    with pytest.raises(ValueError, match="divisible"):
        simulate_step_time([1, 2, 3], 2, "heap", 1, MODEL)
    with pytest.raises(ValueError, match="max_token_len"):
        simulate_step_time([10, 5000], 1, "ours", 1, MODEL, max_token_len=100)
    with pytest.raises(ValueError, match="flat"):
        simulate_step_time([[1, 2]], 1, "ours", 1, MODEL)
