"""The job on a Ray cluster of several nodes (all on 127.0.0.1, ray.cluster_utils.Cluster), joined through
RAY_ADDRESS as on a real cluster: DP ranks spread over the nodes, worker groups pinned to nodes by custom
resources, a node removed mid-run named in the run's one line, and a resume on the node left.

Node A (the head, the driver's node) offers {CPU: 1, node_a: 2}, node B {CPU: 1, node_b: 2}; a CPU worker
asks for 0.5 CPU. Ray's Cluster helper would record its address in /tmp/ray/ray_current_cluster, where a
plain ray.init() of any other process here would join it: that write is turned off. Waits are bounded."""
import os
import shutil
import sys
import tempfile

import pytest
import ray

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
from cli import train_grpo  # noqa: E402
from mindspeed_rl.utils.checkpoint import TRACKER  # noqa: E402
from mindspeed_rl.utils.ray_utils import init_ray, shutdown_ray  # noqa: E402
from mindspeed_rl.workers.scheduler import launcher  # noqa: E402

GRPO = os.path.join(ROOT, "configs", "grpo_tiny_cpu.yaml")
PPO = os.path.join(ROOT, "configs", "ppo_tiny_cpu.yaml")
START_S = 600.0


def _node_args(temp, name):
    return dict(num_cpus=1, resources={name: 2}, node_ip_address="127.0.0.1", temp_dir=temp)


@pytest.fixture(scope="module")
def cluster():
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    shutdown_ray()  # the system tests' shared local Ray (started again below)
    patch = pytest.MonkeyPatch()
    patch.setattr(ray._private.utils, "write_ray_address", lambda *a, **k: None)
    patch.setattr(ray._common.utils, "reset_ray_address", lambda *a, **k: None)
    temp = tempfile.mkdtemp(prefix="msrl_mn_", dir="/tmp")  # short: Ray's socket paths
    made = cluster_utils.Cluster(initialize_head=True,
                                 head_node_args=dict(_node_args(temp, "node_a"), include_dashboard=False))
    try:
        made.add_node(**_node_args(temp, "node_b"))
        made.wait_for_nodes(timeout=START_S)
        patch.setenv("RAY_ADDRESS", made.address)  # the job joins this cluster (init_ray)
        made.temp = temp
        yield made
    finally:
        patch.undo()
        shutdown_ray()
        made.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
        init_ray(num_cpus=2)


def _node_b(cluster):
    """The live node that offers node_b (added again when an earlier test removed it)."""
    nodes = [n for n in cluster.worker_nodes if n.node_id in _alive()]
    if not nodes:
        nodes = [cluster.add_node(**_node_args(cluster.temp, "node_b"))]
        cluster.wait_for_nodes(timeout=START_S)
    return nodes[0]


def _alive():
    if not ray.is_initialized():
        ray.init(address=os.environ["RAY_ADDRESS"])
    try:
        return {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()


@pytest.fixture
def groups(monkeypatch):
    """Every worker group the run starts, with what the test hooks into its checkpoint saves."""
    made, after_save = [], []

    class Recorded(launcher.RayActorGroup):
        def __init__(self, worker, run_plan, **kwargs):
            made.append(self)
            super().__init__(worker, run_plan, **kwargs)

        def save_checkpoint(self, *args, **kwargs):
            out = super().save_checkpoint(*args, **kwargs)
            while after_save:
                after_save.pop(0)()
            return out
    monkeypatch.setattr(launcher, "RayActorGroup", Recorded)
    return made, after_save


def _nodes_of(group):
    return [node for _, node in group.pids]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny") / "model")


def test_actor_group_on_one_node_critic_group_on_another(cluster, groups, tiny_model, tmp_path, capsys):
    """PPO: the actor group (its ranks roll out and train the policy) pinned to node A, the critic group
    (trains the value model) to node B, by rl_config.<group>_resource.custom_resources; unpinned, 'auto'
    would spread the two ranks of each group over both nodes."""
    node_b = _node_b(cluster)
    made, _ = groups
    code = train_grpo.main(["--config", PPO, "--output-dir", str(tmp_path / "out"), "--tiny-model-dir", tiny_model,
                            "megatron_training.train_iters=1",
                            "rl_config.actor_resource.custom_resources={node_a: 1}",
                            "rl_config.critic_resource.custom_resources={node_b: 1}"])
    assert code == 0, capsys.readouterr().err
    actor, critic = made
    assert _nodes_of(actor) == [cluster.head_node.node_id] * 2
    assert _nodes_of(critic) == [node_b.node_id] * 2


def test_dp_ranks_spread_a_removed_node_is_one_line_and_the_run_resumes_on_the_node_left(
        cluster, groups, tiny_model, tmp_path, capsys):
    node_b = _node_b(cluster)
    made, after_save = groups
    out, save = str(tmp_path / "out"), str(tmp_path / "ckpt")
    args = ["--config", GRPO, "--output-dir", out, "--tiny-model-dir", tiny_model,
            "megatron_training.train_iters=2", f"megatron_training.save={save}", "megatron_training.save_interval=1"]
    after_save.append(lambda: cluster.remove_node(node_b))  # once iteration 1 is saved
    code = train_grpo.main(args)
    err = capsys.readouterr().err
    # rl_config.placement_strategy 'auto' spread the two DP ranks over the two nodes
    assert sorted(_nodes_of(made[0])) == sorted([cluster.head_node.node_id, node_b.node_id])
    assert code == 1 and not after_save
    line, rank_b = err.strip(), _nodes_of(made[0]).index(node_b.node_id)
    # the rank on node B is named (the rollout queue lives on the driver's node); Ray's own error text: not shown
    assert err.count("\n") == 1 and line.startswith(f"error: worker rank {rank_b} failed in '")
    assert f"died with its node {node_b.node_id} (127.0.0.1): the node was terminated" in line
    assert line.endswith(f"; the last checkpoint is iteration 1 in {save}")
    assert open(os.path.join(save, TRACKER)).read().strip() == "1"
    # the resume on the node left: both ranks there (one node: 'auto' packs)
    code = train_grpo.main(args + [f"megatron_training.load={save}"])
    said = capsys.readouterr()
    assert code == 0, said.err
    assert _nodes_of(made[-1]) == [cluster.head_node.node_id] * 2
    assert "done: 1 iterations" in said.out
    assert open(os.path.join(save, TRACKER)).read().strip() == "2"
