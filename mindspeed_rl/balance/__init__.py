"""DP balance: every data-parallel rank gets a near-equal share of the work at every stage.

The package's lowest floor: pure functions and small state machines over lengths (numpy, torch tensors), no
torch.distributed, no Ray, no imports from the rest of the package. Distributed callers live above it.

How each stage is balanced, and the key that switches it:

| stage | what balances it | key (rl_config) |
| --- | --- | --- |
| rollout | one queue per round (``rollout_queue.RolloutQueue``): engines draw rows, longest expected first | ``rollout_balance`` ('queue'; 'static': fixed seeded shares, upstream's ``guarantee_order: true``) |
| multi-turn rollout | the same queue; a conversation's next turn goes to the engine running fewest rows or stays | ``multi_turn_routing`` |
| partial rollout | each pass is a queue round over the pool's unfinished rows, groups holding cut rows first | ``partial_rollout_max_split`` |
| ref / actor log-probs, critic values, actor / critic update | one plan per stage per round (``balance_plan.BalancePlanner``) over ``seqlen_balancing`` | ``use_dp_batch_balance``, ``dp_balance_objective`` ('tokens' / 'flops': ``workload``), ``dp_balance_method`` |
| micro-batches inside a rank | capped, balanced packing (``seqlen_balancing.rearrange_micro_batches``); the count is agreed over DP by ``utils.dist_sync`` | ``use_dynamic_bsz``, ``max_packing_token_size`` |

Modules: ``seqlen_balancing`` (partitions: upstream's names), ``partition_refine`` / ``partition_exact`` (its
local and exact search), ``workload`` (tokens and flops workloads), ``balance_plan`` (stage plans),
``rollout_queue`` (the take rule), ``rollout_cost`` (the rollout step cost and the replay of a round),
``rollout_figures`` (a round's balance figures for the iteration line), ``cost_model`` (a fitted stage-time
model for the end-to-end benchmark). Upstream's path ``mindspeed_rl.utils.seqlen_balancing`` is this
package's module under its old name. Guide: docs/features/dp_batch_balance.md.
"""
