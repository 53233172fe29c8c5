"""DAPO's dynamic sampling in the async modes, in-process (the workers and engine of test_dapo_sampling.py): the
real trainer step over rounds from the rollout pipeline. At max_staleness 0 the run is the sync run row for row;
ahead of the trainer, the refills come from the engines' batches in data order and their staleness is counted."""
import mindspeed_rl.trainer.dapo_trainer_hybrid as dapo
from mindspeed_rl.plan import build_configs, load_config
from tests.ut.dapo.test_dapo_sampling import (DAPO, TINY, Group, Reward, _trained, batches,  # noqa: F401
                                             local, workers_of)  # noqa: F401  (local: a fixture)


class Engines(Group):
    """The engine group in-process: a started batch runs at once; loads and the weights are recorded."""

    def __init__(self, workers):
        super().__init__(workers)
        self.world_size, self.loads, self.started = len(workers), [], []

    def start_queued_stage(self, group, queued, **context):
        self.started.append(context["iteration"])
        return self.run_queued_stage(group, queued, **context)

    def finish_stage(self, pending):
        return pending

    def stage_done(self, pending):
        return True

    def load_weights(self, state_ref, version):
        self.loads.append((state_ref, version))
        return [version]

    def wait(self, refs, name):
        assert name == "load_weights"


class Actor(Group):
    def policy_state_ref(self):
        return "weights"


def _run(iterations, *overrides):
    plan = build_configs(load_config(TINY, DAPO + list(overrides))).plan
    workers = workers_of(plan)
    engines = Engines(workers_of(plan)) if plan.asynchronous is not None else None
    trainer = dapo.RayDAPOTrainer(actor_worker=Actor(workers), reward_list=[Reward()], run_plan=plan,
                                  dataset_additional_keys=["labels"], rollout_worker=engines, train_iters=iterations)
    trainer.load_state_dict({"iteration": 0, "data_position": 0})
    history = trainer.fit(batches())
    return history, workers, engines, trainer


def test_at_staleness_0_the_async_run_is_the_sync_run(local):
    sync, sync_workers, _, _ = _run(3, "rl_config.rollout_correction={rollout_is: null}")
    level, workers, engines, trainer = _run(3, "rl_config.trainer_mode=separate_async", "rl_config.max_staleness=0",
                                            "rl_config.rollout_correction={rollout_is: null}")
    assert _trained(workers) == _trained(sync_workers)  # the same rows trained, in the same order
    keys = [k for k in sync[0] if k.startswith(("dapo/", "reward/", "response_length/"))]
    assert [{k: m[k] for k in keys} for m in level] == [{k: m[k] for k in keys} for m in sync]
    assert all(m["async/staleness_max"] == 0 for m in level)
    # every batch the filter drew was started by the pipeline, in data order, and trained from
    assert engines.started == list(range(1, len(engines.started) + 1))
    assert len(engines.started) == sum(m["dapo/rollout_batches"] for m in level) == trainer.data_position
    assert [v for _, v in engines.loads] == [0, 1, 2, 3]


def test_ahead_of_the_trainer_the_refills_come_from_the_engines(local):
    history, _, engines, trainer = _run(3, "rl_config.trainer_mode=separate_async", "rl_config.max_staleness=2",
                                        "rl_config.rollout_correction={rollout_is: null}")
    drawn = [int(m["dapo/rollout_batches"]) for m in history]
    assert all(d >= 1 for d in drawn)
    # iteration 1 trains on batches of the starting weights; later ones on batches started earlier
    assert history[0]["async/staleness_max"] == 0 and history[-1]["async/staleness_max"] >= 1
    assert engines.started[:3] == [1, 2, 3]  # two batches ahead from the start
    assert trainer.pipeline.taken == sum(drawn)
