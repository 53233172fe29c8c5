"""The dock as a Ray actor under many concurrent consumers (local loopback Ray)."""
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import ray
import torch

from mindspeed_rl.trainer.utils.transfer_dock import GRPOTransferDock

COLS = ["responses", "prompt_length", "response_length"]


def _remote_dock(prompts, n, seed=0):
    td = GRPOTransferDock.remote(prompts, n, timeout=30)
    rng = np.random.default_rng(seed)
    plen = rng.integers(4, 64, prompts)
    ray.get(td.put_prompts_experience.remote({"prompts": [torch.ones(int(p), dtype=torch.int32) for p in plen]}))
    resp = np.maximum(1, rng.lognormal(5, 1.2, prompts * n)).astype(int)
    ray.get(td.put_experience.remote({"responses": [torch.ones(int(r), dtype=torch.int32) for r in resp],
                                      "response_length": [torch.tensor([int(r)]) for r in resp]},
                                     list(range(prompts * n))))
    return td, np.repeat(plen, n) + resp


def _fetch(td, consumer, count, balance):
    batch, idx = ray.get(td.get_experience.remote(consumer, COLS, count, use_batch_seqlen_balance=balance))
    return idx


@pytest.mark.parametrize("ranks", [8, 64])
def test_concurrent_consumers_each_row_once(local_ray, ranks):
    td, total = _remote_dock(ranks * 2, 4, seed=ranks)
    count = 8  # two groups per rank
    with ThreadPoolExecutor(max_workers=ranks) as pool:
        shares = list(pool.map(lambda _: _fetch(td, "actor_train", count, True), range(ranks)))
    assert all(s is not None and len(s) == count for s in shares)
    flat = sorted(i for s in shares for i in s)
    assert flat == list(range(ranks * 8)), "every row served exactly once, none lost"
    assert ray.get(td.all_consumed.remote("actor_train"))
    loads = np.array([total[s].sum() for s in shares])
    metrics = ray.get(td.get_metrics.remote()).compute()
    assert loads.max() / loads.mean() - 1 == pytest.approx(metrics["dp_balance/actor_train/imbalance"])
    assert metrics["dp_balance/actor_train/imbalance"] < metrics["dp_balance/actor_train/imbalance_random"]
    ray.kill(td)


def test_consumers_from_separate_processes(local_ray):
    td, _ = _remote_dock(16, 2, seed=1)

    @ray.remote(num_cpus=0.1)
    def rank_task(dock):
        _, idx = ray.get(dock.get_experience.remote("ref_log_prob", COLS, 4, use_batch_seqlen_balance=True))
        return idx

    shares = ray.get([rank_task.remote(td) for _ in range(8)])
    assert sorted(i for s in shares for i in s) == list(range(32))
    ray.kill(td)


def test_replies_and_puts_travel_as_one_buffer_per_column(local_ray):
    from mindspeed_rl.data.columnar import ColumnBatch
    td = GRPOTransferDock.remote(4, 2, timeout=30)
    rows = [torch.arange(i + 1, dtype=torch.float32) for i in range(8)]
    ray.get(td.put_experience.remote(ColumnBatch({"old_log_prob": rows}), list(range(8))))
    batch, idx = ray.get(td.get_experience.remote("trainer", ["old_log_prob"], indexes=[5, 0, 7]))
    assert isinstance(batch, ColumnBatch) and idx == [5, 0, 7]
    assert [t.tolist() for t in batch["old_log_prob"]] == [rows[5].tolist(), rows[0].tolist(), rows[7].tolist()]
    assert len({t.untyped_storage().data_ptr() for t in batch["old_log_prob"]}) == 1  # views of one buffer
