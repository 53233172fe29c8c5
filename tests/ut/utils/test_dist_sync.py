import os

import torch.distributed as dist
import torch.multiprocessing as mp

from mindspeed_rl.utils.dist_sync import sync_micro_batch_count
from mindspeed_rl.balance.seqlen_balancing import rearrange_micro_batches


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        # rank r holds lengths that need r + 2 micro-batches of 100 tokens
        lengths = [90] * (rank + 2)
        local = rearrange_micro_batches(lengths, 100)
        count = sync_micro_batch_count(len(local))
        parts = rearrange_micro_batches(lengths, 100, min_num_micro_batches=count)
        with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
            f.write(f"{len(local)} {count} {len(parts)}")
    finally:
        dist.destroy_process_group()


def test_micro_batch_count_synced_to_max_over_gloo(tmp_path):
    world = 3
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    rows = [(tmp_path / f"{r}.txt").read_text().split() for r in range(world)]
    assert [int(r[0]) for r in rows] == [2, 3, 4]
    # every rank runs 4 passes; rank 0 and 1 pad with empty micro-batches
    assert all(int(r[1]) == 4 and int(r[2]) == 4 for r in rows)


def test_without_process_group_count_is_local():
    assert sync_micro_batch_count(5) == 5
