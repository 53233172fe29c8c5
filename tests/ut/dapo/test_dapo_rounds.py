"""Dynamic sampling's fresh-batch rounds (trainer/modes/rounds.py) in-process, as test_dapo_sampling: each batch's
dock round follows the data position (2p - 2 for the batch, 2p - 1 for the train round, so a resumed run draws the
same random splits), and the ranks' rollout figures add up over the batches."""
from mindspeed_rl.plan.stages import ROLLOUT
from mindspeed_rl.trainer.stage_trainer import rank_timing_metrics
from mindspeed_rl.trainer.utils.batch_metrics import sum_by_rank
from tests.ut.dapo.test_dapo_sampling import _trainer, batches, local  # noqa: F401  (fixture)


def test_rounds_follow_the_data_position_and_rollout_figures_add_up(local):
    trainer, _ = _trainer()
    data = batches()
    trainer.data_iter = data
    rounds, rollouts = [], []
    set_round, run_stages = trainer.transfer_dock.set_round, trainer.run_stages

    def recording_round(r):
        rounds.append(r)
        return set_round(r)

    def recording_stages(stages, iteration):
        metrics, results = run_stages(stages, iteration=iteration)
        if stages[0].name == ROLLOUT.name:
            rollouts.append(results)
        return metrics, results
    trainer.transfer_dock.set_round, trainer.run_stages = recording_round, recording_stages
    m = trainer.step(1, next(data))
    assert m["dapo/rollout_batches"] == 2.0 and trainer.data_position == 2
    assert rounds == [0, 2, 3]  # batch 1, batch 2, the train round after batch 2
    assert len(rollouts) == 2
    want = rank_timing_metrics(sum_by_rank(rollouts[0] + rollouts[1]))
    keys = [k for k in want if k.startswith("tokens/actor_rollout/rank")]
    assert keys and all(m[k] == want[k] for k in keys)
    once = rank_timing_metrics(sum_by_rank(rollouts[1]))
    assert any(m[k] != once[k] for k in keys)  # both batches counted, not the last alone
