"""Upstream's pull dock in-process: its settings and their defaults, the wait's error, the consumers' messages,
seeded random takes, plans bound to a request's shape, and the thread setting of the dock actor."""
import inspect
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.compat import transfer_dock as td
from mindspeed_rl.compat.transfer_dock import PullDock, TransferDock
from mindspeed_rl.plan.run_plan import BalanceSpec, Layout, RunPlan, StagePlan, Timeouts
from mindspeed_rl.plan.stages import VALUES
from mindspeed_rl.utils.metrics import Metric


def _filled(prompts=4, n=2, **kw):
    dock = PullDock(prompts, n, **kw)
    dock.put_prompts_experience({"prompts": [torch.tensor([1] * (p + 1)) for p in range(prompts)]})
    rows = list(range(prompts * n))
    dock.put_experience({"responses": [torch.tensor([5] * (r % 3 + 1)) for r in rows],
                         "response_length": [torch.tensor([r % 3 + 1]) for r in rows]}, rows)
    return dock


def test_the_signatures_are_upstreams():
    defaults = {name: {k: p.default for k, p in inspect.signature(fn).parameters.items()
                       if p.default is not inspect.Parameter.empty and k != "_ray_trace_ctx"}
                for name, fn in (("update_metrics", PullDock.update_metrics), ("get", PullDock.get_experience),
                                 ("init", PullDock.__init__))}
    assert defaults["update_metrics"] == {"key": "", "value": None, "cumulate": False}
    assert defaults["get"] == {"experience_count": None, "indexes": None, "get_n_samples": True,
                               "use_batch_seqlen_balance": False}
    assert defaults["init"]["seed"] == 1234 and defaults["init"]["timeout"] is None


def test_timeouts_default_to_300_s_polled_every_50_ms_and_must_be_positive():
    dock = TransferDock(1, 1, ["prompts"])
    assert (dock.timeout, dock.timeout_interval) == (300.0, 0.05)
    dock = PullDock(1, 1, timeout=7, timeout_interval=0.5)
    assert (dock.timeout, dock.timeout_interval) == (7.0, 0.5)
    assert type(dock.timeout_interval) is float
    for timeout, interval in ((0, 1), (-1, 1), (1, 0), (1, -0.5)):
        with pytest.raises(ValueError, match="^TransferDock: timeout and timeout_interval must be positive$"):
            TransferDock(1, 1, ["prompts"], timeout=timeout, timeout_interval=interval)


def test_a_read_that_times_out_names_the_reader_the_columns_and_at_most_16_rows():
    dock = PullDock(20, 1, timeout=0.01, timeout_interval=0.001)
    dock.put_experience({"responses": [torch.tensor([1])]}, [0])
    with pytest.raises(TimeoutError) as err:
        dock.get_experience("actor_train", ["responses", "old_log_prob"], indexes=list(range(17)))
    # 16 rows are named whole; of 17 the first 16 and " ..."
    assert str(err.value) == (f"transfer dock: consumer 'actor_train' waited 0.01s for data that never came: "
                              f"'responses' rows {list(range(1, 17))}; 'old_log_prob' rows {list(range(16))} ...")
    with pytest.raises(TimeoutError) as err:
        dock._get(["old_log_prob"], list(range(16)))
    assert str(err.value) == ("transfer dock: consumer '_get' waited 0.01s for data that never came: "
                              f"'old_log_prob' rows {list(range(16))}")
    assert int(dock.get_consumer_status()["actor_train"].sum()) == 0  # a timeout consumed nothing


def test_consumers_and_bad_requests_are_refused_with_the_request_named():
    dock = _filled()
    cases = [
        (lambda: dock.get_experience("nobody", ["prompts"], 2), "^get experience: unknown consumer 'nobody'; "),
        (lambda: dock.all_consumed("nobody"), "^all_consumed: unknown consumer 'nobody'; "),
        (lambda: dock.get_experience("trainer", ["nope"], 2),
         r"^get experience for 'trainer': unknown columns \['nope'\]"),
        (lambda: dock.get_experience("trainer", ["prompts"], indexes=[99]),
         r"^get experience for 'trainer': row 99 is outside"),
        (lambda: dock.get_experience("trainer", ["prompts"], True), "^get experience for 'trainer': "
                                                                    "experience_count must be a positive int"),
        (lambda: dock._get(["nope"], [0]), r"^get experience: unknown columns \['nope'\]"),
        (lambda: dock._get(["prompts"], [99]), "^get experience: row 99 is outside"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    batch, rows = dock.get_experience("trainer", ["responses"], 1, get_n_samples=False)  # one row is a count
    assert len(rows) == 1 and len(batch["responses"]) == 1


def test_random_takes_are_seeded_by_the_seed_and_the_round():
    assert PullDock(1, 1).seed == 1234
    dock = _filled(seed=11)
    dock.set_round(5)  # a resumed run's round
    _, rows = dock.get_experience("trainer", ["responses"], 3, get_n_samples=False)
    order = torch.randperm(8, generator=torch.Generator().manual_seed(11 * 1_000_003 + 5))
    assert rows == order[:3].tolist()
    assert dock.get_consumer_status()["trainer"].dtype == torch.int32
    assert dock.get_consumer_status()["trainer"].tolist() == [int(r in rows) for r in range(8)]


def test_a_balanced_take_waits_for_the_length_columns_it_plans_with():
    dock = PullDock(2, 2)
    dock.put_prompts_experience({"prompts": [torch.tensor([1]), torch.tensor([1, 2])]})
    # prompts are ready, response lengths not yet: a balanced consumer cannot plan
    assert dock.get_experience("actor_train", ["prompts"], 2, use_batch_seqlen_balance=True) == (None, None)
    assert dock.get_experience("actor_train", ["prompts"], 2) != (None, None)  # a random one can take them


def test_a_plan_serves_requests_of_its_own_shape_only():
    dock = _filled(prompts=4, n=2)
    _, groups = dock.get_experience("actor_train", ["responses"], 4, use_batch_seqlen_balance=True)
    assert len(groups) == 4  # two whole groups
    assert dock.planner._plans["actor_train"][0] == (2, 2)  # the plan's shape: 2-row units, 2 per request
    # two units again, but rows now: a new plan, not the group plan's next share
    _, rows = dock.get_experience("actor_train", ["responses"], 2, get_n_samples=False,
                                  use_batch_seqlen_balance=True)
    assert len(rows) == 2 and not set(rows) & set(groups)


def test_a_take_outside_the_plan_drops_that_consumers_plan_only():
    for outside in ("indexes", "random"):
        dock = _filled(prompts=4, n=2)
        dock.get_experience("actor_train", ["responses"], 2, use_batch_seqlen_balance=True)
        dock.get_experience("actor_log_prob", ["responses"], 2, use_batch_seqlen_balance=True)
        if outside == "indexes":
            dock.get_experience("actor_train", ["responses"], indexes=[6, 7])
        else:
            dock.get_experience("actor_train", ["responses"], 2)
        assert set(dock.planner._plans) == {"actor_log_prob"}, outside


def test_rank_metrics_are_recorded_on_the_dock_as_given():
    metrics = Metric()
    dock = PullDock(1, 1, metrics=metrics)
    assert dock.get_metrics() is metrics
    dock.update_metrics("timing/x", 2.0)
    dock.update_metrics("timing/x", 3.0)
    assert metrics.metric["timing/x"] == 3.0
    with pytest.raises(ValueError, match="metric key must be a non-empty str, got ''"):
        dock.update_metrics(value=1.0)  # no key given: upstream's default '' names nothing
    dock.update_metrics("timing/y", 1.0, cumulate=True)
    dock.update_metrics("timing/y", 4.0, cumulate=True)
    assert metrics.metric["timing/y"] == [1.0, 4.0]


def test_a_run_plan_gives_the_timeout_seed_balance_and_its_stages_columns():
    values = StagePlan(VALUES.name, 2, 1, False, stage=VALUES, inputs=VALUES.inputs)
    plan = RunPlan(Layout(1, 1, 1), prompts_per_round=2, n_samples=1, mini_batch_rows=2, epochs=1,
                   train_iters=1, stages={VALUES.name: values}, balance=BalanceSpec(method="karmarkar_karp"),
                   seed=77, timeouts=Timeouts(42.0, 60.0, 60.0))
    dock = PullDock(2, 1, run_plan=plan, timeout=5, timeout_interval=0.2, seed=3, balance_method="greedy")
    assert (dock.timeout, dock.timeout_interval, dock.seed) == (42.0, 0.2, 77)
    assert dock.planner.method == "karmarkar_karp" and dock.run_plan is plan
    assert "values" not in td.DEFAULT_COLUMNS and "values" in dock.experience_columns
    plain = PullDock(2, 1, seed=3, balance_method="greedy", balance_objective="tokens")
    assert (plain.seed, plain.planner.method, plain.planner.seed) == (3, "greedy", 3)
    assert "values" not in plain.experience_columns


def test_the_dock_actor_runs_on_one_thread_and_the_driver_keeps_its_own(monkeypatch):
    calls = []
    monkeypatch.setattr(td.torch, "set_num_threads", calls.append)
    for initialized, actor, expected in ((True, "actor-1", [1]), (True, None, []), (False, "actor-1", [])):
        calls.clear()
        monkeypatch.setattr(td.ray, "is_initialized", lambda: initialized)
        monkeypatch.setattr(td.ray, "get_runtime_context", lambda: SimpleNamespace(get_actor_id=lambda: actor))
        PullDock(1, 1)
        assert calls == expected, (initialized, actor)
