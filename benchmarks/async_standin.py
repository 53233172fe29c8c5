"""Stand-ins on a wall clock for bench_async_modes.py: rollout engines whose decode step costs the same however many
rows it runs (a device's shape, up to ``slots`` rows) and a trainer whose update takes a fixed time per row, each on
devices (locks) of its own or shared. The project's own RolloutPipeline schedules them (trainer/modes/pipeline.py),
the project's RolloutQueue hands the rows to the engines, the project's async step (trainer/modes/async_modes.py)
runs the iterations: only the model work is a sleep.

A row's length rides in its prompt (prompt [L, batch]): the engine decodes L tokens. An engine runs continuous
batching: it fills its free slots from the queue, sleeps ``step_s`` per decode step of its live rows, holding its
device; a colocated trainer holds the same devices while it trains, so the two time-share them."""
import queue as queues
import threading
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

from mindspeed_rl.plan import build_configs, load_config
from mindspeed_rl.data.driver_dock import DriverDock
from mindspeed_rl.trainer.grpo_trainer_hybrid import RayGRPOTrainer
from mindspeed_rl.trainer.modes import async_modes
from mindspeed_rl.trainer.modes.pipeline import RolloutPipeline
from mindspeed_rl.balance.rollout_queue import LocalSource, RolloutQueue

TINY = Path(__file__).resolve().parents[1] / "configs" / "grpo_tiny_cpu.yaml"


class Round:
    def __init__(self, queued, engines: int, cap: int, outputs):
        self.queued, self.outputs = queued, outputs
        self.queue, self.lock = RolloutQueue(), threading.Lock()
        self.queue.load(1, len(queued.order), engines, None, cap, queued.groups, queued.prior)
        self.made: List = [None] * engines
        self.done = [threading.Event() for _ in range(engines)]


class LockedQueue:
    """One round's queue shared by engine threads."""

    def __init__(self, rnd: Round):
        self.rnd, self.key = rnd, rnd.queue.key

    def take(self, *args):
        with self.rnd.lock:
            return self.rnd.queue.take(*args)


class ThreadEngines:
    """``engines`` threads, engine e on device ``devices[e]`` (a lock); calls run in the order sent, as Ray runs
    an actor's."""

    def __init__(self, devices: List[threading.Lock], step_s: float, slots: int, load_s: float = 0.0):
        self.devices, self.step_s, self.slots, self.load_s = devices, step_s, slots, load_s
        self.world_size = len(devices)
        self.calls = [queues.Queue() for _ in devices]
        self.spans: List[tuple] = []  # (engine, start, end) of every round
        self.threads = [threading.Thread(target=self._run, args=(e,), daemon=True) for e in range(len(devices))]
        for t in self.threads:
            t.start()

    def close(self):
        for c in self.calls:
            c.put(None)
        for t in self.threads:
            t.join(timeout=30)

    def _run(self, e: int):
        while True:
            call = self.calls[e].get()
            if call is None:
                return
            kind, arg = call
            if kind == "load":
                time.sleep(self.load_s)
                arg.set()
            else:
                self._serve(e, arg)

    def _serve(self, e: int, rnd: Round):
        start = time.time()
        source = LocalSource(LockedQueue(rnd), e, rnd.queued.order, {"prompts": rnd.queued.batch["prompts"]})
        live: Dict[int, int] = {}     # row id -> tokens left
        length: Dict[int, int] = {}
        position: Dict[int, int] = {}
        rows, busy = [], 0.0
        drained = False

        def progress():  # what the engines report with a take: tokens made so far by every row of the round
            return [(position[r], length[r] - live.get(r, 0)) for r in length]

        while True:
            free = self.slots - len(live)
            if free > 0 and not drained:
                source.request(free, progress if length else None)
                got = source.poll(block=True)
                if got is None or len(got) == 0:
                    drained = True
                else:
                    for row, pos, prompt in zip(got.ids, got.positions, got.inputs["prompts"]):
                        live[int(row)] = length[int(row)] = int(prompt[0])
                        position[int(row)] = int(pos)
            if not live:
                break
            steps = min(live.values())
            with self.devices[e]:  # the device is this engine's for these decode steps
                time.sleep(steps * self.step_s)
                busy += steps * self.step_s
            for row in list(live):
                live[row] -= steps
                if live[row] == 0:
                    del live[row]
                    rows.append(row)
        responses = [torch.full((length[r],), 5, dtype=torch.int32) for r in rows]
        out = {"responses": responses, "response_length": [torch.tensor([t.numel()]) for t in responses],
               "rollout_log_probs": [torch.zeros(t.numel()) for t in responses]}
        end = time.time()
        trace = {"rows": rows, "busy": busy, "latency": [busy] * len(rows), "consumer": e, "span": (start, end),
                 "trace": [[max((t.numel() for t in responses), default=0), len(rows), len(rows), busy]]}
        self.spans.append((e, start, end))
        rnd.made[e] = ({c: out[c] for c in rnd.outputs}, trace)
        rnd.done[e].set()

    # ------------------------------------------------------------ the launcher's interface

    def start_queued_stage(self, group, queued, iteration):
        rnd = Round(queued, self.world_size, self.slots, group.outputs)
        for c in self.calls:
            c.put(("round", rnd))
        return rnd

    def stage_done(self, rnd):
        return all(d.is_set() for d in rnd.done)

    def finish_stage(self, rnd):
        for d in rnd.done:
            if not d.wait(600):
                raise TimeoutError("a stand-in engine did not finish its round")
        metrics = [{"rank": float(e), "timing/actor_rollout": rnd.made[e][1]["busy"]} for e in range(self.world_size)]
        return metrics, [m for m in rnd.made if m[1]["rows"]]

    def load_weights(self, state_ref, version):
        events = [threading.Event() for _ in self.calls]
        for c, ev in zip(self.calls, events):
            c.put(("load", ev))
        return events

    def wait(self, events, name):
        for ev in events:
            ev.wait(600)


class Actor:
    def __init__(self, sync_s: float):
        self.sync_s = sync_s

    def policy_state_ref(self):
        time.sleep(self.sync_s)
        return "weights"


class StandInTrainer:
    """What the async step reads of the trainer; the train stages hold the trainer's devices ``train_s`` per
    iteration (``rows`` rows)."""
    took_batch = RayGRPOTrainer.took_batch

    def __init__(self, overrides, engines: ThreadEngines, devices: List[threading.Lock], train_s: float,
                 train_iters: int, lengths, sync_s: float = 0.0):
        self.run_plan = build_configs(load_config(TINY, ["megatron_training.model_path=/unused", *overrides])).plan
        plan = self.run_plan
        self.transfer_dock = DriverDock(plan.dock_prompts, plan.n_samples, addition_columns=["labels"],
                                        run_plan=plan)
        self.dataset_additional_keys = ["labels"]
        self.train_iters, self.data_position, self.iteration = train_iters, 0, 0
        self.groups = {"actor": Actor(sync_s)}
        self.pipeline = RolloutPipeline(self, engines, plan.asynchronous)
        self.devices, self.train_s = devices, train_s
        self.data_iter = iter(lengths)
        self.spans: List[tuple] = []  # (start, end) wall clock of every update

    def checked(self, batch):
        return batch

    def run_stages(self, stages, iteration):
        for d in self.devices:
            d.acquire()
        start = time.time()
        try:
            time.sleep(self.train_s)
        finally:
            for d in self.devices:
                d.release()
        self.spans.append((start, time.time()))
        return {}, []

    def finish_step(self, iteration, metrics, results, start):
        return dict(metrics, **{"timing/iteration": time.perf_counter() - start})

    def fit(self) -> List[dict]:
        self.pipeline.push(self.groups["actor"].policy_state_ref(), 0)
        return [async_modes.step(self, k, next(self.data_iter)) for k in range(1, self.train_iters + 1)]


def length_batches(prompts: int, count: int, seed: int, median: float, sigma: float, cap: int):
    """``count`` prompt batches whose prompt [L, k] asks for L tokens: lognormal lengths (a long tail), capped."""
    rng = np.random.default_rng(seed)
    for k in range(1, count + 1):
        lengths = np.minimum(cap, np.maximum(1, rng.lognormal(np.log(median), sigma, prompts))).astype(int)
        yield {"prompts": [torch.tensor([int(L), k], dtype=torch.int32) for L in lengths],
               "labels": [torch.tensor([int(L)]) for L in lengths]}
