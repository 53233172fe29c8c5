"""Upstream MindSpeed-RL's compatible surface, kept apart from our own core.

Code ported from upstream expects ranks that pull their rows from a dock actor
and write results back themselves. Everything that serves it lives here:

- ``transfer_dock``: ``TransferDock`` (reads wait for their data), ``PullDock``
  (consumers, ``get_experience(..., use_batch_seqlen_balance)``, metrics) and
  ``GRPOTransferDock``, its Ray actor class (``GRPOTransferDock.remote(...)``);
- ``workers``: the rank-side write path (``init_transfer_dock``,
  ``collect_transfer_dock_data``) and ``sync_init_transfer_dock`` of a worker
  group, mixed into ``BaseWorker`` and ``RayActorGroup``;
- ``compute_utils``: upstream's reward and advantage stages over a dock
  (``compute_rule_reward``, ``compute_advantage``, ``get_last_reward``,
  ``compute_grpo_data_metrics``) and ``dock_call``;
- ``rule_reward``: upstream's worker-side ``RuleReward``.

Every name also imports from its upstream module path (docs/upstream_api.md).
Our trainer uses none of it: its ``DriverDock`` pushes each DP rank its rows
(trainer/stage_runner.py).
"""
from mindspeed_rl._lazy import lazy_exports

_EXPORTS = {
    "TransferDock": "mindspeed_rl.compat.transfer_dock",
    "PullDock": "mindspeed_rl.compat.transfer_dock",
    "GRPOTransferDock": "mindspeed_rl.compat.transfer_dock",
    "UpstreamWorkerIO": "mindspeed_rl.compat.workers",
    "UpstreamGroupIO": "mindspeed_rl.compat.workers",
    "compute_rule_reward": "mindspeed_rl.compat.compute_utils",
    "compute_advantage": "mindspeed_rl.compat.compute_utils",
    "get_last_reward": "mindspeed_rl.compat.compute_utils",
    "compute_grpo_data_metrics": "mindspeed_rl.compat.compute_utils",
    "dock_call": "mindspeed_rl.compat.compute_utils",
    "RuleReward": "mindspeed_rl.compat.rule_reward",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
