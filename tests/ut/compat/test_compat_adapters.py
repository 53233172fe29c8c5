"""Upstream's adapters in compat/ without Ray: RuleReward's set-up and checks, the reward and advantage stages
over a dock object or a stand-in actor handle, and the rank / group write path."""
from types import SimpleNamespace

import pytest
import torch

from mindspeed_rl.compat import compute_utils, rule_reward
from mindspeed_rl.workers import upstream_io as workers
from mindspeed_rl.compat.rule_reward import RuleReward
from mindspeed_rl.data.driver_dock import DriverDock


class Remote:
    """A method of a stand-in actor: `.remote(...)` gives what `ray.get` (patched to identity) returns."""

    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args, **kwargs):
        return ("ref", self.fn(*args, **kwargs))


class Handle:
    """A stand-in dock actor handle over a dock object."""

    def __init__(self, dock, rows=None):
        self.dock, self.calls = dock, []
        for name in ("get_rows", "put_experience"):
            setattr(self, name, Remote(self._record(getattr(dock, name), name)))
        self.get_experience_len = Remote(lambda: rows)

    def _record(self, fn, name):
        def call(*args, **kwargs):
            self.calls.append(name)
            return fn(*args, **kwargs)
        return call


@pytest.fixture
def no_ray(monkeypatch):
    def get(ref):
        assert ref[0] == "ref", "ray.get of something that is not a remote call's result"
        return ref[1]
    monkeypatch.setattr(compute_utils.ray, "get", get)


def _dock(scores=None, rows=4):
    dock = DriverDock(rows // 2, 2, experience_columns=["prompts", "prompt_length", "responses", "labels",
                                                         "response_length", "rm_scores", "advantages"])
    dock.put_prompts_experience({"prompts": [torch.tensor([1, 2]), torch.tensor([1])][: rows // 2],
                                 "labels": [torch.tensor([7]), torch.tensor([8])][: rows // 2]}, ["labels"])
    dock.put_experience({"responses": [torch.tensor([7] * (r + 1)) for r in range(rows)],
                         "response_length": [torch.tensor([r + 1]) for r in range(rows)]}, list(range(rows)))
    if scores is not None:
        dock.put_experience({"rm_scores": [torch.tensor([s]) for s in scores]}, list(range(rows)))
    return dock


class Scorer:
    made = []

    def __init__(self, functions, weights, eos, tokenizer=None, parallel=1, timeout=30.0):
        self.args = dict(functions=functions, weights=weights, eos=eos, tokenizer=tokenizer, parallel=parallel,
                         timeout=timeout)
        Scorer.made.append(self)

    def __call__(self, responses, labels):
        return torch.tensor([float(len(r)) for r in responses])


RL = SimpleNamespace(verifier_function=["f"], verifier_weight=[0.5], verifier_parallel=3, verifier_timeout=9.0)


def test_initialize_takes_the_verifiers_and_the_eos_of_the_tokenizer(monkeypatch):
    monkeypatch.setattr(rule_reward, "_Scorer", Scorer)
    inner = object()
    reward = RuleReward()
    assert reward.scorer is None and reward.td is None
    reward.initialize(None, RL, SimpleNamespace(eod=0, eos_token_id=5, tokenizer=inner))
    assert reward.scorer.args == dict(functions=["f"], weights=[0.5], eos=0, tokenizer=inner, parallel=3,
                                      timeout=9.0)
    plain = SimpleNamespace(eos_token_id=5)  # a transformers tokenizer: no eod, no wrapped tokenizer
    reward.initialize(None, RL, plain)
    assert reward.scorer.args["eos"] == 5 and reward.scorer.args["tokenizer"] is plain


def test_calls_before_set_up_are_refused_by_name(monkeypatch):
    monkeypatch.setattr(rule_reward, "_Scorer", Scorer)
    reward = RuleReward()
    with pytest.raises(RuntimeError, match=r"^RuleReward: call initialize\(\) first$"):
        reward([torch.tensor([1])], [torch.tensor([1])])
    with pytest.raises(RuntimeError, match=r"^RuleReward: call initialize\(\) and init_transfer_dock\(\) first$"):
        reward.compute_rm_score()
    reward.initialize(None, RL, SimpleNamespace(eod=0))
    with pytest.raises(RuntimeError, match="init_transfer_dock"):
        reward.compute_rm_score()  # a scorer but no dock
    assert reward([torch.tensor([1, 2])], [torch.tensor([1])]).tolist() == [2.0]
    with pytest.raises(NotImplementedError, match="^multimodal transfer docks are not implemented$"):
        reward.init_transfer_dock(_dock(), mm_td=object())
    assert reward.td is None
    reward.init_transfer_dock("handle")
    assert reward.td == "handle"


def test_compute_rm_score_scores_every_row_of_a_dock_object_or_an_actor(monkeypatch, no_ray):
    monkeypatch.setattr(rule_reward, "_Scorer", Scorer)
    for through_handle in (False, True):
        dock = _dock()
        reward = RuleReward()
        reward.initialize(None, RL, SimpleNamespace(eod=0))
        # the actor says how many rows it holds; a dock object is asked its max_len
        reward.init_transfer_dock(Handle(dock, rows=3) if through_handle else dock)
        metrics = reward.compute_rm_score()
        rows = 3 if through_handle else 4
        expected = [float(r + 1) for r in range(rows)]
        got = dock.get_rows(["rm_scores"], list(range(rows)))["rm_scores"]
        assert [float(s) for s in got] == expected
        assert metrics["reward/mean"] == pytest.approx(sum(expected) / rows)
        assert (metrics["reward/max"], metrics["reward/min"]) == (max(expected), 1.0)


def test_dock_call_calls_a_method_or_gets_an_actors_result(no_ray):
    dock = _dock()
    assert compute_utils.dock_call(dock, "get_rows", ["response_length"], [1])["response_length"][0].item() == 2
    handle = Handle(dock)
    got = compute_utils.dock_call(handle, "get_rows", ["response_length"], [2, 3])
    assert [int(x) for x in got["response_length"]] == [3, 4] and handle.calls == ["get_rows"]


def test_compute_advantage_normalises_each_group_of_n_samples(no_ray):
    dock = _dock(scores=[1.0, 3.0, 0.0, 0.0])
    compute_utils.compute_advantage(Handle(dock), n_samples=2, total_rows=4)
    adv = [float(a) for a in dock.get_rows(["advantages"], [0, 1, 2, 3])["advantages"]]
    expected = compute_utils.compute_group_norm_advantages(torch.tensor([1.0, 3.0, 0.0, 0.0]), 2).tolist()
    assert adv == pytest.approx(expected)
    assert adv[0] < 0 < adv[1] and adv[2:] == [0.0, 0.0]
    with pytest.raises(ValueError, match="^adv_estimator 'gae' is not supported; use 'group_norm'$"):
        compute_utils.compute_advantage(dock, 2, 4, adv_estimator="gae")


def test_get_last_reward_keeps_the_shape_and_normalises_groups():
    scores = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    out = compute_utils.get_last_reward(scores, 2)
    assert out.shape == scores.shape
    assert out[1].tolist() == [0.0, 0.0]
    assert out[0].tolist() == pytest.approx([-(2 ** -0.5), 2 ** -0.5], abs=1e-6)
    # upstream's eps is 1e-8: a group whose rewards differ by 1e-5 still gets advantages of about +-0.707
    close = compute_utils.get_last_reward(torch.tensor([0.0, 1e-5]), 2)
    assert close.tolist() == pytest.approx([-(2 ** -0.5), 2 ** -0.5], rel=2e-3)


def test_data_metrics_cover_the_first_total_rows(no_ray):
    dock = _dock()
    metrics = compute_utils.compute_grpo_data_metrics(Handle(dock), 3)
    assert metrics["response_length/mean"] == 2.0 and metrics["response_length/max"] == 3.0
    assert metrics["response_length/min"] == 1.0 and metrics["prompt_length/mean"] == pytest.approx(5 / 3)


class Rank(workers.UpstreamWorkerIO):
    def __init__(self, tp_src):
        self.is_tp_src = tp_src


def test_only_the_tp_source_writes_its_rows_and_only_when_it_has_some(monkeypatch):
    monkeypatch.setattr(workers.ray, "get", lambda ref: ref[1])
    puts = []
    td = SimpleNamespace(put_experience=Remote(lambda data_dict, indexes: puts.append((data_dict, indexes))))
    src, peer = Rank(True), Rank(False)
    for rank in (src, peer):
        rank.init_transfer_dock(td)
        assert rank.td is td
    values = {"old_log_prob": [torch.tensor([0.5]), torch.tensor([0.25])]}
    peer.collect_transfer_dock_data(values, [0, 1])
    src.collect_transfer_dock_data(values, [])
    assert puts == []
    src.collect_transfer_dock_data(values, (4, 5), use_vllm=True)
    (data, indexes), = puts
    assert indexes == [4, 5] and [t.tolist() for t in data["old_log_prob"]] == [[0.5], [0.25]]
    src.shutdown()
    assert src.td is None


class Group(workers.UpstreamGroupIO):
    def __init__(self):
        self.sent = []

    def execute_sync_command(self, method, *args):
        self.sent.append((method, args))


def test_a_group_hands_its_ranks_an_actor_handle_and_refuses_a_driver_dock(monkeypatch):
    class FakeHandle:
        pass
    monkeypatch.setattr(workers.ray.actor, "ActorHandle", FakeHandle)
    group, handle = Group(), FakeHandle()
    group.sync_init_transfer_dock(handle)
    assert group.sent == [("init_transfer_dock", (handle,))]
    with pytest.raises(TypeError, match=r"^sync_init_transfer_dock: ranks take a GRPOTransferDock actor handle, "
                                        r"got DriverDock \(a DriverDock stays in the driver"):
        group.sync_init_transfer_dock(_dock())
    assert len(group.sent) == 1
