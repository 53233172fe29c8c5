"""SPREAD placement on a real two-node Ray cluster (both nodes on 127.0.0.1): with the default
'auto' strategy the ranks of a group land on different nodes, where PACK keeps them on one.

Ray's Cluster helper records its address in /tmp/ray/ray_current_cluster, where a plain
``ray.init()`` of any other process on this machine would find and join it; the helper's write and
removal of that file are turned off here. Bounds are generous (a loaded machine may take minutes)."""
import os
import shutil
import tempfile

import pytest
import ray

from mindspeed_rl.plan.run_plan import Layout, RunPlan, Timeouts
from mindspeed_rl.workers.base_worker import BaseWorker
from mindspeed_rl.workers.scheduler.launcher import RayActorGroup

START_S = 600.0


@pytest.fixture(scope="module")
def two_nodes():
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    if ray.is_initialized():
        ray.shutdown()
    patch = pytest.MonkeyPatch()
    patch.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
    patch.setattr(ray._common.utils, "reset_ray_address", lambda *a, **k: None)
    temp = tempfile.mkdtemp(prefix="msrl_cl_", dir="/tmp")  # short: Ray's socket paths
    node = dict(num_cpus=2, node_ip_address="127.0.0.1", temp_dir=temp, include_dashboard=False)
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args=node)
    try:
        cluster.add_node(**{k: v for k, v in node.items() if k != "include_dashboard"})
        cluster.wait_for_nodes(timeout=START_S)
        ray.init(address=cluster.address)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        patch.undo()
        shutil.rmtree(temp, ignore_errors=True)


def _plan(placement):
    return RunPlan(Layout(2, 2, 1), prompts_per_round=1, n_samples=1, mini_batch_rows=1, epochs=1, train_iters=1,
                   timeouts=Timeouts(START_S, START_S + 60, START_S), placement=placement)


@pytest.mark.parametrize("placement, spread", [("auto", True), ("PACK", False)])
def test_ranks_of_a_group_land_on_different_nodes_with_spread(two_nodes, placement, spread):
    class Where(BaseWorker):  # defined here: sent to the workers by value
        def node(self):
            return ray.get_runtime_context().get_node_id()

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    # 0.5 CPU per rank: one node could hold both, so only SPREAD puts them apart
    group = RayActorGroup(Where, _plan(placement), num_cpus_per_worker=0.5)
    try:
        assert group.strategy == ("SPREAD" if spread else "PACK")
        nodes = group.execute_sync_command("node")
        assert [node for _, node in group.pids] == nodes  # what the launcher records for error messages
    finally:
        group.shutdown()
    assert (nodes[0] != nodes[1]) is spread
