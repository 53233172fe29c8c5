"""Whether the iteration line's balance figures are a signal: a rollout round in which every engine took its rows
in one take is the static split (nothing to balance), one whose engines were busy for milliseconds is noise (too
short to measure); a planned stage with one row per rank has nothing to balance either. The JSONL keeps every
figure and the flags that decide."""
import pytest

from mindspeed_rl.balance.rollout_figures import MIN_MEASURED_BUSY_S, engine_takes, queue_figures, rollout_note
from mindspeed_rl.balance.rollout_queue import LocalSource, RolloutQueue
from mindspeed_rl.trainer.stage_trainer import StageTableTrainer
from mindspeed_rl.trainer.utils.batch_metrics import merge_rollout_metrics
from mindspeed_rl.utils.metrics import plan_balance_metrics
from tests.ut.dapo.test_dapo_sampling import _trainer, batches, local  # noqa: F401  (fixture)

R = "actor_rollout"
NOTHING = f"{R}: nothing to balance (1 take per engine) "


def key(stat, name=R):
    return f"dp_balance/{name}/{stat}"


def figures(busy, records, chunk, takes=None):
    """The figures of a round of two engines and four rows (two each), each engine's ``records``; ``takes``: the
    counts the workers send (None: none sent, the records tell)."""
    traces = [{"consumer": c, "rows": [2 * c, 2 * c + 1], "busy": b, "latency": [b / 2, b / 2], "trace": t}
              for c, (b, t) in enumerate(zip(busy, records))]
    for t, n in zip(traces, takes or ()):
        t["takes"] = n
    metrics, _ = queue_figures(R, [0, 1, 2, 3], [2, 2, 2, 2], [8, 2, 6, 4], traces, 2, chunk, None if chunk else 2,
                               2, [[0, 1], [2, 3]])
    return metrics


def line(metrics):
    return StageTableTrainer._summary(1, metrics)


def test_one_chunk_per_engine_has_nothing_to_balance():
    # transformers: one generate over a chunk of two rows per engine, seconds long
    m = figures([3.0, 1.5], [[(8, 2, 4, 3.0)], [(6, 2, 4, 1.5)]], chunk=2)
    assert m[key("takes/rank0")] == m[key("takes/rank1")] == 1.0
    assert m[key("balanced_takes")] == 0.0 and m[key("measured")] == 0.0
    assert m[key("rank_imbalance")] == pytest.approx(1 / 3)  # the figures stay in the JSONL
    assert NOTHING in line(m) and f"{R}:imb=" not in line(m) and "bound+" not in line(m)
    # vLLM: every row joined its engine's batch in the first step (no prompt tokens later): one take each
    m = figures([3.0, 1.5], [[(1, 2, 4, 0.5)] + [(1, 1, 0, 0.5)] * 5, [(1, 2, 4, 0.5), (1, 1, 0, 1.0)]], chunk=None)
    assert m[key("balanced_takes")] == 0.0 and NOTHING in line(m)


def test_several_takes_per_engine_with_long_busy_times_print_the_figures():
    m = figures([3.0, 2.0], [[(8, 1, 2, 2.0), (2, 1, 2, 1.0)], [(6, 1, 2, 1.5), (4, 1, 2, 0.5)]], chunk=1)
    assert m[key("takes/rank0")] == m[key("takes/rank1")] == 2.0
    assert m[key("balanced_takes")] == 2.0 and m[key("measured")] == 1.0 and rollout_note(m, R) is None
    static = m[key("rank_imbalance_random")] = 0.25  # what plan_balance_metrics adds from the replayed plan
    assert line(m).endswith(f" {R}:imb=20.00%(static {static:.2%}) bound+{m[key('bound_gap')]:.1%} ")
    # vLLM: new prompt tokens in a later step are a second take
    m = figures([3.0, 2.0], [[(1, 1, 2, 1.0), (1, 2, 2, 2.0)], [(1, 1, 2, 1.0), (1, 2, 2, 1.0)]], chunk=None)
    assert m[key("balanced_takes")] == 2.0 and f"{R}:imb=20.00%" in line(m)


def test_tiny_busy_times_are_too_short_to_measure():
    short = MIN_MEASURED_BUSY_S * 0.9
    m = figures([short * 1.5, short * 0.5], [[(8, 1, 2, 0.01), (2, 1, 2, 0.01)], [(6, 1, 2, 0.01), (4, 1, 2, 0.01)]],
                chunk=1)
    assert m[key("balanced_takes")] == 2.0 and m[key("busy_mean_s")] == pytest.approx(short)
    assert m[key("measured")] == 0.0 and m[key("rank_imbalance")] == pytest.approx(0.5)
    assert line(m).endswith(f" {R}: too short to measure (engines busy 45 ms, under 50 ms) ")
    # at the floor the figures are printed
    m = figures([MIN_MEASURED_BUSY_S * 1.5, MIN_MEASURED_BUSY_S * 0.5], [[(1, 1, 1, 0.01)] * 2] * 2, chunk=1)
    assert m[key("measured")] == 1.0 and f"{R}:imb=50.00%" in line(m)
    # nothing to balance is said first, however short the round
    m = figures([0.001, 0.002], [[(8, 2, 4, 0.001)], [(6, 2, 4, 0.002)]], chunk=2)
    assert NOTHING in line(m)


def test_the_workers_count_beats_the_records():
    # multi-turn: one take, three generates (a turn each); the count the source kept says one take
    records = [[(4, 2, 4, 1.0)] * 3, [(4, 2, 4, 1.0)] * 3]
    assert engine_takes({"trace": records[0]}, chunked=True) == 3
    assert engine_takes({"trace": records[0], "takes": 1}, chunked=True) == 1
    assert figures([3.0, 3.0], records, chunk=2)[key("balanced_takes")] == 4.0
    assert figures([3.0, 3.0], records, chunk=2, takes=[1, 1])[key("balanced_takes")] == 0.0


def test_several_rounds_of_one_iteration_print_the_figures_when_any_round_balanced():
    one = figures([3.0, 1.5], [[(8, 2, 4, 3.0)], [(6, 2, 4, 1.5)]], chunk=2)
    several = figures([3.0, 2.0], [[(8, 1, 2, 2.0), (2, 1, 2, 1.0)], [(6, 1, 2, 1.5), (4, 1, 2, 0.5)]], chunk=1)
    assert NOTHING in line(merge_rollout_metrics([one, one]))
    assert f"{R}:imb=" in line(merge_rollout_metrics([one, several]))


def test_a_source_counts_the_takes_that_brought_rows():
    queue = RolloutQueue()
    firsts = queue.load(1, 6, 2, chunk=2, first=1)
    sources = [LocalSource(queue, c, list(range(6)), {"prompts": list(range(6))}, first=firsts[c]) for c in (0, 1)]
    assert [len(s.poll(block=True)) for s in sources] == [2, 2]  # the first takes, answered with the load
    assert len(sources[0].poll(block=True)) == 2 and sources[0].drained  # the last chunk
    assert not sources[1].drained and len(sources[1].poll(block=True)) == 0  # an empty answer: no take
    assert [s.takes for s in sources] == [2, 1] and [s.seq for s in sources] == [2, 2]


def test_the_workers_send_their_takes_and_the_default_tiny_run_has_nothing_to_balance(local):
    # the tiny CPU config: one chunk of rows_per_share rows per engine
    trainer, _ = _trainer()
    trainer.data_iter = batches()
    m = trainer.step(1, next(trainer.data_iter))
    assert m[key("takes/rank0")] == m[key("takes/rank1")] == 1.0 and m[key("balanced_takes")] == 0.0
    assert NOTHING in StageTableTrainer._summary(1, m)
    # chunks of 4 rows: the engines take in turns, 3 chunks each of a batch's 24 rows
    trainer, _ = _trainer("rl_config.actor_rollout_dispatch_size=4")
    trainer.data_iter = batches()
    group, sent = trainer.groups["actor"], []
    serve = group.run_queued_stage

    def recording(*args, **kwargs):
        metrics, made = serve(*args, **kwargs)
        sent.extend(trace.get("takes") for _, trace in made)
        return metrics, made
    group.run_queued_stage = recording
    m = trainer.step(1, next(trainer.data_iter))
    assert sent == [3, 3, 3, 3]  # two rollout batches (dynamic sampling), the count in every engine's trace
    assert m[key("takes/rank0")] == m[key("takes/rank1")] == 3.0 and m[key("balanced_takes")] == 4.0
    assert "nothing to balance" not in StageTableTrainer._summary(1, m)


@pytest.mark.parametrize("sizes, ranks, most", [([1, 1], [0, 1], 1.0), ([1, 1, 1, 1], [0, 1, 0, 1], 2.0),
                                                ([2, 1], None, 2.0)])
def test_a_planned_stage_with_one_row_per_rank_has_nothing_to_balance(sizes, ranks, most):
    plan = {"consumer": "ref_log_prob", "sizes": sizes, "random_loads": [5.0] * len(sizes), "ranks": ranks}
    m = plan_balance_metrics([plan])
    assert m[key("rows_per_rank_max", "ref_log_prob")] == most
    m[key("rank_imbalance", "ref_log_prob")] = 0.5
    text = line(m)
    if most == 1.0:
        assert text.endswith(" ref_log_prob: nothing to balance (1 row per rank)") and "imb=" not in text
    else:
        assert text.endswith(" ref_log_prob:imb=50.00%(random 0.00%)")
    # the most over the consumer's plans; a plan without sizes leaves the key out
    assert plan_balance_metrics([plan, dict(plan, sizes=[3, 1], ranks=None)])[
        key("rows_per_rank_max", "ref_log_prob")] == 3.0
    assert key("rows_per_rank_max", "ref_log_prob") not in plan_balance_metrics([{"consumer": "ref_log_prob",
                                                                                   "random_loads": [1.0, 2.0]}])
