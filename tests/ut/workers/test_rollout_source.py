"""A rank's end of the rollout queue (workers/rollout_source.py) over a stand-in for the queue's Ray actor,
and the worker's queued stage around it (base_worker.run_queued_stage): which consumer a rank is, which source
it uses, what it refuses."""
import dataclasses
import itertools

import pytest
import ray
import torch

import mindspeed_rl.workers.integrated_worker as iw
import mindspeed_rl.workers.rollout_source as rs
from mindspeed_rl.plan.rollout_spec import RolloutSpec
from mindspeed_rl.plan.stages import ROLLOUT, ROLLOUT_LOG_PROBS, TRAIN
from mindspeed_rl.trainer.stage_runner import StageGroup
from mindspeed_rl.balance.rollout_queue import RolloutQueue
from mindspeed_rl.workers.parallel_state import ParallelState
from ut.workers.test_integrated_worker import RecordingEngine, _setup


class Ref:
    def __init__(self, value, ready=True):
        self.value, self.ready = value, ready


class Handle:
    """The queue actor as a rank sees it: ``take.remote(...)`` gives a ref; ``ready`` says whether refs are."""

    def __init__(self, queue, ready=True):
        self.queue, self.ready, self.calls = queue, ready, []
        handle = self

        class Take:
            @staticmethod
            def remote(*args):
                handle.calls.append(args)
                return Ref(queue.take(*args), handle.ready)
        self.take = Take


class Waits(list):
    """The timeouts ray.wait was called with; ``gets``: those ray.get was called with."""
    gets: list


@pytest.fixture
def fake_ray(monkeypatch):
    waits = Waits()
    waits.gets = []

    def wait(refs, timeout=None):
        waits.append(timeout)
        return [r for r in refs if r.ready], [r for r in refs if not r.ready]

    def get(ref, timeout="not given"):
        waits.gets.append(timeout)
        if not ref.ready:
            raise ray.exceptions.GetTimeoutError("timed out")
        return ref.value
    monkeypatch.setattr(rs.ray, "wait", wait)
    monkeypatch.setattr(rs.ray, "get", get)
    return waits


def _source(handle, deadline=100.0, clock=lambda: 0.0):
    return rs.RaySource(handle, 7, 1, [10, 11, 12, 13], {"prompts": ["a", "b", "c", "d"]}, deadline, clock)


def test_a_take_goes_out_once_and_is_read_without_waiting(fake_ray):
    queue = RolloutQueue()
    queue.load(7, 4, 2, cap=2)
    handle, sent = Handle(queue, ready=False), []
    source = _source(handle)
    assert source.poll() is None and not source.waiting  # nothing asked, nothing to read
    source.request(0, progress=lambda: sent.append("none") or [])
    assert not source.waiting and sent == []
    source.request(3, progress=lambda: sent.append("sent") or [(0, 1)])
    source.request(3, progress=lambda: sent.append("again") or [])
    assert handle.calls == [(7, 1, 0, 3, [(0, 1)], None)] and sent == ["sent"] and source.waiting
    assert source.poll(block=False) is None and fake_ray == [0]  # looked at, not waited for
    source._ref.ready = True  # the answer arrives
    got = source.poll(block=False)  # a first take: every second row of the best four (two consumers)
    assert got.positions == [0, 2] and got.ids == [10, 12] and got.inputs == {"prompts": ["a", "c"]}
    assert not source.waiting and source.seq == 1


def test_a_blocking_poll_asks_by_itself_and_marks_the_end(fake_ray):
    queue = RolloutQueue()
    queue.load(7, 4, 2, chunk=3)
    handle = Handle(queue)
    source = _source(handle)
    assert source.poll(block=True).ids == [10, 11, 12]
    assert handle.calls[-1] == (7, 1, 0, 1, None, None)  # a bare blocking poll asks for one row
    queue.take(7, 0, 0, 1)  # the other consumer took the last chunk
    assert len(source.poll(block=True)) == 0 and source.drained
    source.request(4)
    assert source.poll(block=True) is None and len(handle.calls) == 2


def test_no_answer_before_the_deadline_is_a_timeout_naming_the_take(fake_ray):
    queue = RolloutQueue()
    queue.load(7, 4, 2, cap=2)
    times = itertools.count(95.0, 4.0)
    source = _source(Handle(queue, ready=False), deadline=100.0, clock=lambda: next(times))
    source.request(2)
    with pytest.raises(rs.QueueTimeoutError, match=r"^rollout queue: consumer 1 got no answer to take 0 of round 7 "
                                                   r"before the stage deadline$"):
        source.poll(block=True)
    assert fake_ray.gets == [5.0]  # waited what was left of the deadline (asked at 95, deadline 100)
    late = _source(Handle(queue, ready=False), deadline=100.0, clock=lambda: 120.0)
    late.seq = 1
    late.request(2)
    with pytest.raises(rs.QueueTimeoutError):  # past the deadline: no wait at all
        late.poll(block=True)
    assert fake_ray.gets[-1] == 0.0


def _worker(backend="hf", tp=1, world=2):
    cfgs, _, workers = _setup(f"actor_config.tensor_model_parallel_size={tp}", f"rl_config.actor_resource.num_npus={world}")
    plan = cfgs.plan
    plan = dataclasses.replace(plan, worker=dataclasses.replace(plan.worker, rollout=RolloutSpec(backend, "test")))
    out = []
    for w in workers:
        w.run_plan = plan
        w.parallel_state = ParallelState.from_layout(w.rank, plan.layout)
        out.append(w)
    return plan, out


@pytest.mark.parametrize("backend, consumers", [("hf", [(0, True), (0, False), (1, True), (1, False)]),
                                                ("vllm", [(0, True), (1, True), (2, True), (3, True)])])
def test_a_rank_is_its_own_consumer_unless_its_tp_group_generates_together(local, backend, consumers):
    _, workers = _worker(backend, tp=2, world=4)
    assert [w.rollout_consumer() for w in workers] == consumers


def test_a_queued_stage_reads_from_the_queue_actor_through_a_ray_source(local, fake_ray):
    plan, (w0, _) = _worker()
    queue = RolloutQueue()
    rows = plan.rows_per_round
    queue.load(3, rows, 2, chunk=rows // 2)
    handle = Handle(queue)
    order = list(range(100, 100 + rows))
    batch = {"prompts": [torch.tensor([1, 2, i]) for i in range(rows)]}
    metrics, out, trace = w0.run_queued_stage(StageGroup.of(plan.stages[ROLLOUT.name]), order, batch, handle, 3,
                                              iteration=5)
    assert handle.calls[0][:3] == (3, 0, 0)  # round 3, consumer 0, its first take (none came with the round)
    deadline = plan.timeouts.stage_deadline  # a take waits at most the stage deadline from the stage's start
    assert fake_ray.gets and all(deadline - 60 < t <= deadline for t in fake_ray.gets)
    assert trace["consumer"] == 0 and sorted(trace["rows"]) == order  # the only engine: it made every row
    assert len(out["responses"]) == rows and metrics["rank"] == 0.0
    seeds = [c[1]["seed"] for c in w0.actor.calls if c[0] == "generate"]
    chunk = rows // 2
    assert seeds == [iw.rollout_seed(plan.seed, 5, row) for row in order[::chunk]]  # the context reached it


def test_a_queued_stage_refuses_what_is_not_one_queued_stage(local):
    plan, (w0, _) = _worker()
    queue = RolloutQueue()
    with pytest.raises(ValueError, match=r"^rank 0: a queued stage runs alone, got \['actor_rollout', 'actor_train'\]$"):
        w0.run_queued_stage(StageGroup((plan.stages[ROLLOUT.name], plan.stages[TRAIN.name])), [], {}, queue, 1)
    with pytest.raises(ValueError, match=r"^rank 0: the run plan has no queued stage 'actor_train'$"):
        w0.run_queued_stage(StageGroup.of(plan.stages[TRAIN.name]), [], {}, queue, 1)


@pytest.fixture
def local(monkeypatch):
    monkeypatch.setattr(iw, "CausalLMEngine", RecordingEngine)


class ServedBy:
    """A rollout backend that serves what the test gives it and records how it was called."""

    def __init__(self, served):
        self.served, self.calls, self.prepared = served, [], 0

    def prepare(self):
        self.prepared += 1

    def serve(self, source, sampling, seed_of, eos_id, pad_id, chunk):
        self.calls.append((source, sampling, seed_of(5), eos_id, pad_id, chunk))
        return self.served


def test_serve_sequences_reports_the_rows_made_and_their_times(local, monkeypatch):
    from mindspeed_rl.models.rollout.base import Served
    plan, (w0, _) = _worker("vllm")
    spec = dataclasses.replace(plan.worker.rollout, logprobs=0)
    w0.run_plan = plan = dataclasses.replace(plan, worker=dataclasses.replace(plan.worker, rollout=spec))
    served = Served(rows=[4, 1], prompt_lengths=[3, 2], responses=[torch.ones(5, dtype=torch.int32),
                                                                   torch.ones(1, dtype=torch.int32)],
                    log_probs=[torch.zeros(5), torch.zeros(1)], latency=[0.5, 0.25], trace=[(1, 2, 5, 0.25)],
                    busy=0.75)
    w0.rollout = ServedBy(served)
    clock = iter([10.0, 10.5, 13.0])  # start, after the weight sync, the end
    monkeypatch.setattr(iw.time, "perf_counter", lambda: next(clock))
    metrics, out, trace = w0.serve_sequences("the source")
    assert w0.rollout.prepared == 1
    source, sampling, seed, eos, pad, chunk = w0.rollout.calls[0]
    assert (source, sampling, eos, pad, chunk) == ("the source", plan.worker.sampling, 13, 14,
                                                   plan.stages[ROLLOUT.name].rows_per_share)
    assert seed == iw.rollout_seed(plan.seed, 0, 5)  # iteration 0 unless the driver says otherwise
    assert metrics == {"timing/actor_rollout": 3.0, "tokens/actor_rollout": 11.0, "rank": 0.0, "dp_rank": 0.0,
                       "tp_rank": 0.0, "timing/rollout_weight_sync": 0.5}  # no load: the queue has its own figures
    assert [r.tolist() for r in out["responses"]] == [[1] * 5, [1]]
    assert [int(x) for x in out["response_length"]] == [5, 1] and out[ROLLOUT_LOG_PROBS] is served.log_probs
    assert trace["rows"] == [4, 1] and trace["busy"] == 0.75 and trace["latency"] == [0.5, 0.25]
    assert trace["trace"].tolist() == [[1, 2, 5, 0.25]]
    w0.rollout.served = dataclasses.replace(served, log_probs=None)
    w0.run_plan = dataclasses.replace(plan, worker=dataclasses.replace(plan.worker, rollout=RolloutSpec("hf", "t")))
    clock = iter([0.0, 0.0, 1.0])
    _, out, _ = w0.serve_sequences("the source", iteration=3)
    assert ROLLOUT_LOG_PROBS not in out and w0.rollout.calls[1][2] == iw.rollout_seed(plan.seed, 3, 5)


def test_a_ray_source_reads_its_first_take_without_a_call(fake_ray):
    queue = RolloutQueue()
    firsts = queue.load(7, 4, 2, cap=2, first=2)
    handle = Handle(queue)
    source = rs.RaySource(handle, 7, 1, [10, 11, 12, 13], {"prompts": list("abcd")}, 100.0, lambda: 0.0,
                          first=firsts[1])
    source.request(2, progress=lambda: pytest.fail("nothing goes out while the first take is unread"))
    assert not source.waiting and source.poll().ids == [11, 13] and source.seq == 1
    assert handle.calls == [] and fake_ray == [] and source.drained  # the other engine took the rest


@pytest.mark.parametrize("through_ray", [True, False])
def test_a_queued_stage_starts_from_the_first_take_that_came_with_the_round(local, fake_ray, monkeypatch, through_ray):
    plan, (w0, w1) = _worker()
    queue = RolloutQueue()
    rows = plan.rows_per_round
    firsts = queue.load(3, rows, 2, chunk=rows // 2, first=1)  # both chunks out: nothing left to ask for
    asked = []
    monkeypatch.setattr(queue, "take", lambda *args: asked.append(args) or pytest.fail("a take was asked for"))
    batch = {"prompts": [torch.tensor([1, 2, i]) for i in range(rows)]}
    order = list(range(rows))
    for worker in (w0, w1):
        _, _, trace = worker.run_queued_stage(StageGroup.of(plan.stages[ROLLOUT.name]), order, batch,
                                              Handle(queue) if through_ray else queue, 3, firsts=firsts)
        assert trace["rows"] == firsts[worker.rank] and trace["consumer"] == worker.rank
    assert asked == []


def test_an_engine_that_served_no_row_of_a_short_pass_returns_empty_log_probs(local):
    """A partial rollout pass with fewer rows than one engine's take: the other engine serves none, and its (empty)
    columns still go back through Ray; rows made without the log-probs the run needs are one line."""
    from mindspeed_rl.models.rollout.base import Served
    from mindspeed_rl.data.columnar import cpu_batch
    plan, (w0, _) = _worker("vllm")
    spec = dataclasses.replace(plan.worker.rollout, logprobs=0)
    w0.run_plan = dataclasses.replace(plan, worker=dataclasses.replace(plan.worker, rollout=spec))
    w0.rollout = ServedBy(Served(log_probs=None))
    _, out, trace = w0.serve_sequences("the source")
    assert out["responses"] == [] and out[ROLLOUT_LOG_PROBS] == [] and trace["rows"] == []
    assert cpu_batch(out)[ROLLOUT_LOG_PROBS] == []
    w0.rollout = ServedBy(Served(rows=[0], prompt_lengths=[2], responses=[torch.ones(3, dtype=torch.int32)],
                                 log_probs=None, latency=[0.1], trace=[(3, 1, 2, 0.1)]))
    with pytest.raises(RuntimeError, match=r"^rank 0: the rollout backend made 1 rows without the log-probs this run "
                                           r"needs$"):
        w0.serve_sequences("the source")
