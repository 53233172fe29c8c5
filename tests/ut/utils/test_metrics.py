import numpy as np
import pytest
import torch

from mindspeed_rl.utils.metrics import Metric


def test_replace_and_dict_update():
    m = Metric()
    m.update("lr", 1e-3)
    m.update("lr", 2e-3)
    m.update(value={"a": 1, "b": 2.5})
    assert m.metric == {"lr": 2e-3, "a": 1, "b": 2.5}


def test_cumulate_extends_lists():
    m = Metric()
    m.update(value={"loss": [1.0, 2.0]}, cumulate=True)
    m.update(value={"loss": [3.0], "kl": [0.5]}, cumulate=True)
    m.update("timing/update", value=[10.0, 4.0], cumulate=True)
    m.update("timing/update", value=(12.0,), cumulate=True)
    m.update("tps", 5, cumulate=True)
    m.update("tps", torch.tensor([6.0, 7.0]), cumulate=True)
    assert m.metric["loss"] == [1.0, 2.0, 3.0]
    assert m.metric["kl"] == [0.5]
    assert m.metric["timing/update"] == [10.0, 4.0, 12.0]
    assert m.metric["tps"] == [5, 6.0, 7.0]


def test_cumulate_promotes_plain_value_and_copies_input():
    m = Metric()
    src = [1.0]
    m.update("x", src, cumulate=True)
    m.update("x", [2.0], cumulate=True)
    assert src == [1.0]
    m.update("y", 3.0)
    m.update("y", 4.0, cumulate=True)
    assert m.metric == {"x": [1.0, 2.0], "y": [3.0, 4.0]}


def test_compute_flattens_to_floats():
    m = Metric()
    m.update("loss", [1.0, torch.tensor(2.0), np.float32(6.0)])
    m.update("lr", torch.tensor(0.5))
    m.update("grad", torch.tensor([1.0, 3.0]))
    m.update("arr", np.array([2, 4]))
    m.update("n", 3)
    m.update("none", None)
    m.update("empty", [])
    out = m.compute()
    assert out == {"loss": 3.0, "lr": 0.5, "grad": 2.0, "arr": 3.0, "n": 3.0}
    assert all(type(v) is float for v in out.values())


def test_compute_rejects_non_numeric():
    m = Metric()
    m.update("name", "abc")
    with pytest.raises(TypeError, match="'name'.*str"):
        m.compute()
    m.reset()
    m.update("t", torch.tensor([]))
    with pytest.raises(ValueError, match="'t'.*empty"):
        m.compute()


def test_reset():
    m = Metric()
    m.update("a", [1.0], cumulate=True)
    m.reset()
    assert m.metric == {}
    assert m.compute() == {}


@pytest.mark.parametrize("key", ["", None, 3])
def test_invalid_key(key):
    m = Metric()
    with pytest.raises(ValueError, match="non-empty str"):
        m.update(key, 1.0)
    with pytest.raises(ValueError, match="non-empty str"):
        m.update(value={key: 1.0})
    assert m.metric == {}


def test_imbalance_and_per_rank_loads():
    from mindspeed_rl.utils.metrics import imbalance, per_rank, plan_balance_metrics
    assert imbalance([3.0, 1.0]) == pytest.approx(0.5) and imbalance([0, 0]) == 0.0
    assert per_rank([1.0, 2.0, 3.0, 4.0], [0, 1, 0, 1]) == [4.0, 6.0]
    with pytest.raises(ValueError, match="3 values for 2 ranks"):
        per_rank([1.0, 2.0, 3.0], [0, 1])
    plans = [{"consumer": "c", "random_loads": [3.0, 1.0]}, {"consumer": "c", "random_loads": [1.0, 1.0]}]
    assert plan_balance_metrics(plans) == {"dp_balance/c/rank_imbalance_random": pytest.approx(0.25)}
