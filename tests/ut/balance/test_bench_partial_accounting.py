"""benchmarks/bench_partial_rollout.py's accounting, on stand-in engines (no vLLM): every row partial rollout
starts is finished and paid for (the warm-up iteration counts, the pool is drained after the last iteration),
so a short run cannot leave its long rows' remaining work unmeasured."""

import pytest

from tests.ut.balance.bench_module import import_benchmark


@pytest.fixture(scope="module")
def bench():
    return import_benchmark("bench_partial_rollout")


class Harness:
    """Stands in for the engines: a pass makes every row's budget; it costs 1 s plus 0.01 s per token of its
    longest row (a tail-bound round)."""

    def __init__(self):
        self.passes = []

    def run_pass(self, prompts, budgets, seeds, groups, prior=None):
        self.passes.append(list(budgets))
        wall = 1.0 + 0.01 * max(budgets)
        return wall, wall, [[7] * b for b in budgets], max(budgets)


def run(bench, way, iters=3, prompts=8):
    h = Harness()
    h.drawn = 0

    def stream_of(batches):
        for batch in batches:
            h.drawn += 1
            yield batch
    stream = stream_of(bench.batch_stream(0, 1000, prompts))
    gen = bench.run_plain(h, stream, iters, 0) if way == "plain" else \
        bench.run_partial(h, stream, iters, 4, prompts, 0)
    recs = [next(gen) for _ in range(iters + 2)]  # the iterations, then the drain
    with pytest.raises(StopIteration):
        next(gen)
    return recs[-1], h


def test_partial_rollout_finishes_and_pays_for_every_row_it_started(bench):
    rec, h = run(bench, "partial")
    drain = rec["drain"]
    # the pool held up to 2 x 8 prompts; after the last take 8 groups (64 rows) were still in it
    assert drain["left_rows"] == 64 and drain["rows"] == 64 and drain["passes"] >= 1
    trained = rec["warmup"]["rows"] + sum(rec["rows"]) + drain["rows"]
    # 4 takes (the warm-up and 3 iterations) of 8 groups x 8 samples, and the 8 groups left for the drain: every
    # batch the pool drew (8 prompts of 8 samples each)
    assert h.drawn == 5 and trained == 4 * 64 + 64 == h.drawn * 8 * 8
    walls = [1.0 + 0.01 * max(b) for b in h.passes]
    summary = bench.summarize(rec)
    assert summary["throughput"] == pytest.approx(trained / sum(walls))  # every pass is paid for
    assert summary["throughput_left"] == pytest.approx(sum(rec["rows"]) / sum(rec["rollout_s"]))
    assert summary["left_rows"] == 64 and summary["drain_s"] == pytest.approx(drain["rollout_s"])
    # without the drain and the warm-up the long rows carried past the end were never paid for
    assert summary["throughput_left"] > summary["throughput"]


def test_plain_rollout_finishes_the_same_prompts_as_partial_rollout(bench):
    plain, h = run(bench, "plain")
    partial, hp = run(bench, "partial")
    # nothing carried; the batch partial rollout's pool drew beyond the iterations is rolled out too
    assert plain["drain"]["left_rows"] == 0 and plain["drain"]["rows"] == 64 and plain["drain"]["passes"] == 1
    assert h.drawn == hp.drawn == 5 and len(h.passes) == 5
    trained = {way: r["warmup"]["rows"] + sum(r["rows"]) + r["drain"]["rows"] for way, r in (("plain", plain),
                                                                                           ("partial", partial))}
    assert trained["plain"] == trained["partial"] == 5 * 64
    summary = bench.summarize(plain)
    assert summary["throughput"] == pytest.approx(5 * 64 / sum(1.0 + 0.01 * max(b) for b in h.passes))
    assert summary["throughput_left"] == pytest.approx(3 * 64 / sum(plain["rollout_s"]))


def test_a_record_saved_before_the_drain_is_judged_on_what_it_has(bench):
    rec, _ = run(bench, "partial")
    old = {k: v for k, v in rec.items() if k not in ("drain", "warmup")}
    summary = bench.summarize(old)
    assert summary["throughput"] is None and summary["throughput_left"] == bench.summarize(rec)["throughput_left"]
    reps = [{"plain": {"summary": bench.summarize(old)}, "partial N=4": {"summary": summary}}]
    assert bench.judged_key(reps) == "throughput_left"
