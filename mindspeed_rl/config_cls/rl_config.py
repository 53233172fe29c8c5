"""Settings of the RL algorithm and of the worker layout (``rl_config`` section)."""
from collections.abc import Mapping

from mindspeed_rl.config_cls.base_config import BaseConfig, check_type

DP_BALANCE_OBJECTIVES = ("tokens", "flops")
DP_BALANCE_METHODS = ("auto", "heapq", "karmarkar_karp", "greedy")
PLACEMENT_STRATEGIES = ("auto", "PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
# num_gpus / num_cpus are accepted as other spellings of num_npus.
RESOURCE_KEYS = ("num_npus", "num_gpus", "num_cpus")
RESOURCE_FIELDS = ("actor_resource", "reference_resource", "reward_resource", "critic_resource")


def resource_size(resource):
    """Number of devices (worker processes) a resource entry asks for, or None."""
    if resource is None:
        return None
    if isinstance(resource, Mapping):
        return resource.get("num_npus")
    return getattr(resource, "num_npus", None)


# Ray's own resources: the launcher asks for CPU and the accelerator itself
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "NPU", "memory", "object_store_memory")


def check_custom_resources(field, value):
    """``<field>.custom_resources``: Ray custom resource names (``ray start --resources``) with the amount each
    worker of the group asks for; returned as a plain dict."""
    key = f"rl_config.{field}.custom_resources"
    if not isinstance(value, Mapping) or not value:
        raise TypeError(f"{key} expects a non-empty dict of Ray resource name -> amount per worker "
                        f"(e.g. {{node_a: 1}}), got {value!r}")
    for name, amount in value.items():
        if not isinstance(name, str) or not name or name in RAY_BUILTIN_RESOURCES:
            raise ValueError(f"{key}: {name!r} is not a custom resource name (CPU and the accelerator are asked "
                             f"for by the launcher; give a name a node offers with ray start --resources)")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not amount > 0:
            raise ValueError(f"{key}.{name} must be a number > 0 (the amount each worker asks for), got {amount!r}")
    return {name: float(amount) for name, amount in value.items()}


def normalize_resource(field, resource):
    """Check a resource dict and fill ``num_npus`` from one of its aliases."""
    if resource is None:
        return None
    if not isinstance(resource, Mapping):
        raise TypeError(f"RLConfig: key '{field}' expects dict, got {resource!r}")
    out, custom = {}, None
    for key, value in resource.items():
        key = str(key).replace("-", "_")
        if key == "custom_resources":
            custom = check_custom_resources(field, value)
            continue
        if key not in RESOURCE_KEYS:
            raise ValueError(f"RLConfig: unknown key '{field}.{key}'; "
                             f"allowed: {list(RESOURCE_KEYS) + ['custom_resources']}")
        if value is not None:
            check_type("RLConfig", f"{field}.{key}", 0, value)
        out[key] = value
    given = {v for v in out.values() if v is not None}
    if len(given) > 1:
        raise ValueError(f"RLConfig: '{field}' gives different device counts "
                         f"through aliases: {out}")
    out.setdefault("num_npus", None)
    if out["num_npus"] is None and given:
        out["num_npus"] = given.pop()
    if custom is not None:
        out["custom_resources"] = custom
    return out


class RLConfig(BaseConfig):
    """RL settings. Every key, with its default:

    runtime_env_path ('configs/envs/runtime_env.yaml'): Ray runtime-env file.
    rule_reward (True): score responses with rule-based verifiers.
    beta (0.1): weight of the KL term handed to the actor/reference.
    actor_resource ({'num_npus': None}): devices for the actor; sub-keys
        num_npus, or its aliases num_gpus / num_cpus; custom_resources ({name: amount}): Ray custom
        resources each worker of the group asks for, e.g. to keep the group on the nodes started with
        ``ray start --resources='{"name": N}'`` (also under critic_resource).
    reference_resource (None): devices for a separate reference worker.
    reward_resource (None): devices for a reward-model worker.
    critic_resource (None): devices for PPO's critic group (stage ray_ppo).
    num_samples_per_step (1): samples consumed per step (kept for upstream parity).
    max_prompt_length (512): longest prompt in tokens.
    epochs (1): passes over each rollout batch in the actor update.
    clip_ratio (0.2): PPO ratio clipping range.
    entropy_coeff (0.0): weight of the entropy bonus.
    gamma (1.0): reward discount.
    lam (0.95): GAE lambda.
    cliprange_value (0.5): PPO critic: a new value moves at most this far from the
        rollout-time value in the clipped value loss.
    use_kl_in_reward (False): PPO: take kl_coef * KL(old || ref) from the per-token
        rewards instead of adding a KL term to the actor loss.
    critic_value_dispatch_size, critic_update_dispatch_size (None): PPO critic rows
        per share (values) and upstream's update fetch size; filled by validation.
    advantage_whiten (True): normalise advantages.
    kl_penalty ('low_var_kl'): KL estimator ('kl', 'abs', 'mse', 'low_var_kl', ...).
    kl_ctrl_type ('fixed'): KL coefficient controller ('fixed' or 'adaptive').
    init_kl_coef (0.01): starting KL coefficient.
    kl_horizon (1000): horizon of the adaptive KL controller.
    kl_target (100.0): target KL of the adaptive controller.
    adv_estimator ('group_norm'): advantage estimator, a name registered in mindspeed_rl.algorithms:
        'group_norm' (= verl's 'grpo'), 'rloo', 'reinforce_plus_plus', 'reinforce_plus_plus_baseline'
        (GRPO and DAPO stages), 'gae' (stage ray_ppo, with a critic).
    norm_adv_by_std_in_grpo (True): group_norm divides by the group's std; False: Dr.GRPO.
    loss_mode ('vanilla'): the policy loss: 'vanilla' (PPO clip), 'gspo' (sequence ratio), 'cispo'
        (clipped, detached ratio weighting log-probs).
    loss_agg_mode (None): 'token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean' or
        'seq-mean-token-sum-norm' (Dr.GRPO); None: token_level_loss decides (token-mean, or
        seq-mean-token-mean when false).
    loss_scale_factor (None): seq-mean-token-sum-norm's constant length; None: sampling max_tokens.
    verifier_function (['base_acc']): names of the rule verifiers.
    verifier_weight ([1.0]): one weight per verifier.
    verifier_parallel (1): processes used for rule verification.
    verifier_timeout (30): seconds a verifier may run.
    integrated_mode_config (None): extra options of the integrated worker.
    shuffle_mini_batch (False): shuffle samples before cutting mini-batches.
    enable_sharding_validate (False): check weights after resharding.
    tp_split_expert (False): split MoE experts over TP.
    use_tensorboard (False) / use_wandb (False): metric sinks.
    wandb_project / wandb_exp_name / wandb_save_dir (''): wandb settings.
    blocking (True): wait for each stage before starting the next.
    guarantee_order (False): upstream's name of ``rollout_balance: static`` (true) / ``queue`` (false).
    num_cpus_for_local_task (1.0): CPUs of each local Ray task.
    num_cpus_for_placement_group (8): CPUs per placement-group bundle.
    use_integrated_worker (True): actor, reference and rollout share devices.
    ref_forward_micro_batch_size (None): micro batch of reference log-prob passes.
    actor_forward_micro_batch_size (None): micro batch of actor log-prob passes.
    actor_rollout_dispatch_size, actor_logprob_dispatch_size, ref_dispatch_size,
    reward_dispatch_size, adv_dispatch_size, actor_update_dispatch_size (None):
        samples fetched from the transfer dock per call; filled by validation.
    is_multimodal (False): the policy is a multimodal model.
    use_remove_padding (False): pack sequences without padding.
    n_samples_per_prompt (1): responses generated for every prompt.
    mini_batch_size (1): prompts per optimizer step; after construction it
        holds samples, i.e. the given value times n_samples_per_prompt.
    use_dynamic_bsz (False): build micro batches by a token budget.
    max_packing_token_size (4096): token budget of one dynamic micro batch.
    use_dp_batch_balance (False): balance sequence lengths over DP ranks.
    dp_balance_objective ('tokens'): what to balance, 'tokens' or 'flops'.
    dp_balance_method ('auto'): partition algorithm: 'auto', 'heapq',
        'karmarkar_karp' or 'greedy'.
    rollout_balance ('queue'): how rollout rows reach the engines: 'queue' (one queue of the round that every
        engine draws from, longest expected first) or 'static' (fixed shares bound to DP ranks, a seeded random
        split: upstream's guarantee_order: true). Either key may be given; given both, they must agree.
    partial_rollout_max_split (1): N > 1 cuts a response after max_tokens / N new tokens
        per rollout pass and carries it to the next (plan/partial_rollout.py).
    async_engine (False): with partial rollout, a pass also stops once global_batch_size
        prompts are complete.
    require_max_age_all_finished (True): rows in their N-th pass run to the end.
    rollout_correction (None): verl's rollout correction keys (rollout_is, rollout_is_threshold,
        rollout_rs, rollout_rs_threshold, bypass_mode, ...; plan/rollout_correction.py);
        rollout_is defaults to 'token' with partial rollout.
    Upstream keys of 05a90d7 (hccl_buffersize, zmq_communication,
    log_max_throughput, actor/update_max_packing_token_size, share_backbone, the
    DAPO keys token_level_loss, clip_higher_enable, clip_ratio_low/high,
    overlong_buffer*, rollout_max_tokens, filter_groups_*) keep upstream's
    defaults; what each does here is in unimplemented.py.
    td_timeout (600.0): seconds the transfer dock waits for data before raising.
    stage_timeout (None): seconds one command on the worker group (a stage,
        a save, a load) may take before the run names the ranks that did not
        answer and stops; None: td_timeout.
    placement_strategy ('auto'): Ray placement of the worker ranks: 'auto'
        (SPREAD over the nodes when the cluster has several, PACK on one),
        'PACK', 'SPREAD', 'STRICT_PACK' or 'STRICT_SPREAD'.
    max_nonfinite_iterations (3): stop after this many iterations in a row
        with a non-finite reward, loss or grad norm (their optimizer steps are
        skipped, nothing is saved from them); 0: never stop.
    max_failed_reward_iterations (1): stop after this many iterations in a row in
        which a verifier (of non-zero weight) raised or timed out on every row,
        before training on those zero rewards; 0: never stop (the rows score 0).
    max_all_rejected_iterations (1): stop after this many iterations in a row in
        which rollout correction rejected (or weighed 0) every token, before the
        update; 0: never stop (each such iteration says so).
    multi_turn_enable (False), tool_config_path, max_tool_calls, max_parallel_calls,
        max_total_response_length, max_tool_response_length, tool_response_truncate_side,
        tool_parser_format: upstream's multi-turn rollouts with tools (plan/multi_turn.py).
    tool_call_timeout (60.0): seconds one tool call may take before it is answered as timed out.
    multi_turn_routing (None: plan/multi_turn.py's default): which vLLM engine runs a conversation's next
        turn after its tool round: 'sticky' (the one that ran its earlier turns) or 'free' (the queue hands it to
        the engine running fewest rows).
    trainer_mode ('sync'): how rollout and training share an iteration (verl's names; plan/trainer_mode.py):
        'sync' (rollout, then training); 'colocate_async' (one step off, engines beside the trainer ranks);
        'separate_async' (engines on devices of their own, a buffer between them and the trainer).
    parameter_sync_step (1), max_staleness (1), num_warmup_batches (0): the async modes' schedule: weights go to
        the engines every parameter_sync_step updates; a row is trained at most max_staleness weight versions
        after the weights that sampled it; the first num_warmup_batches iterations run in step.
    drop_stale_rows (false): async modes with partial rollout: a group holding a token sampled more than
        max_staleness weight versions before the trained ones (carried rows span versions) is dropped instead of
        trained with the rollout correction; both are counted (async/dropped_rows, async/over_bound_rows).
    seed (1234): seed of the RL-side random generators.
    """

    def __init__(self, config_dict=None):
        config_dict = config_dict or {}
        self.runtime_env_path = "configs/envs/runtime_env.yaml"
        self.rule_reward = True
        self.beta = 0.1
        self.actor_resource = {"num_npus": None}
        self.reference_resource = None
        self.reward_resource = None
        self.critic_resource = None
        self.num_samples_per_step = 1
        self.max_prompt_length = 512
        self.epochs = 1
        self.clip_ratio = 0.2
        self.entropy_coeff = 0.0
        self.gamma = 1.0
        self.lam = 0.95
        self.cliprange_value = 0.5
        self.use_kl_in_reward = False
        self.advantage_whiten = True
        self.kl_penalty = "low_var_kl"
        self.kl_ctrl_type = "fixed"
        self.init_kl_coef = 0.01
        self.kl_horizon = 1000
        self.kl_target = 100.0
        self.adv_estimator = "group_norm"
        self.verifier_function = ["base_acc"]
        self.verifier_weight = [1.0]
        self.verifier_parallel = 1
        self.verifier_timeout = 30
        self.integrated_mode_config = None

        self.shuffle_mini_batch = False
        self.enable_sharding_validate = False
        self.tp_split_expert = False

        self.use_tensorboard = False
        self.use_wandb = False
        self.wandb_project = ""
        self.wandb_exp_name = ""
        self.wandb_save_dir = ""
        self.blocking = True
        self.guarantee_order = False
        self.num_cpus_for_local_task = 1.0
        self.num_cpus_for_placement_group = 8
        self.use_integrated_worker = True
        self.ref_forward_micro_batch_size = None
        self.actor_forward_micro_batch_size = None

        self.actor_rollout_dispatch_size = None
        self.actor_logprob_dispatch_size = None
        self.ref_dispatch_size = None
        self.reward_dispatch_size = None
        self.adv_dispatch_size = None
        self.actor_update_dispatch_size = None
        self.critic_value_dispatch_size = None
        self.critic_update_dispatch_size = None

        self.is_multimodal = False
        self.use_remove_padding = False
        self.n_samples_per_prompt = 1
        self.mini_batch_size = 1
        self.use_dynamic_bsz = False
        self.max_packing_token_size = 4096

        # upstream keys that only tune upstream's engines (see unimplemented.py)
        self.hccl_buffersize = 256
        self.zmq_communication = True
        self.log_max_throughput = True
        self.actor_max_packing_token_size = None
        self.update_max_packing_token_size = None
        self.share_backbone = False
        # DAPO (upstream 05a90d7); declared in unimplemented.py until implemented
        self.token_level_loss = True
        self.clip_higher_enable = False
        self.clip_ratio_low = 0.1
        self.clip_ratio_high = 0.1
        self.overlong_buffer_enable = False
        self.overlong_buffer = 0
        self.overlong_buffer_penalty_factor = 1.0
        self.rollout_max_tokens = 2048
        self.filter_groups_enable = False
        self.filter_groups_metric = "acc"
        self.filter_groups_max_batches = 1
        self.filter_groups_train_batch_size = 1
        # multi-turn tool use (upstream 05a90d7)
        self.multi_turn_enable = False
        self.tool_config_path = None
        self.max_tool_calls = 0
        self.max_parallel_calls = 0
        self.max_total_response_length = 0
        self.max_tool_response_length = 0
        self.tool_response_truncate_side = None
        self.tool_parser_format = None

        # partial rollout (upstream 05a90d7) and rollout correction (verl's algorithm.rollout_correction keys)
        self.partial_rollout_max_split = 1
        self.async_engine = False
        self.require_max_age_all_finished = True
        self.rollout_correction = None

        # verl's algorithm keys (algorithm.norm_adv_by_std_in_grpo, actor.policy_loss.loss_mode,
        # actor.loss_agg_mode, actor.loss_scale_factor)
        self.norm_adv_by_std_in_grpo = True
        self.loss_mode = "vanilla"
        self.loss_agg_mode = None
        self.loss_scale_factor = None

        # Keys added by this project.
        self.use_dp_batch_balance = False
        self.dp_balance_objective = "tokens"
        self.dp_balance_method = "auto"
        self.rollout_balance = "queue"
        self.td_timeout = 600.0
        self.stage_timeout = None
        self.placement_strategy = "auto"
        self.max_nonfinite_iterations = 3
        self.max_failed_reward_iterations = 1
        self.max_all_rejected_iterations = 1
        self.tool_call_timeout = 60.0
        self.multi_turn_routing = None
        self.trainer_mode = "sync"
        self.parameter_sync_step = 1
        self.max_staleness = 1
        self.num_warmup_batches = 0
        self.drop_stale_rows = False
        self.seed = 1234

        self.update(config_dict)
        # upstream's per-pass token budgets: one budget serves every pass here, the smallest given
        budgets = [b for b in (self.actor_max_packing_token_size, self.update_max_packing_token_size) if b]
        if budgets:
            given = self.max_packing_token_size if "max_packing_token_size" in config_dict else None
            self.max_packing_token_size = min(budgets + ([given] if given else []))
        # The yaml gives prompts per mini-batch; downstream code counts samples.
        self.mini_batch_size = self.mini_batch_size * self.n_samples_per_prompt

    def update(self, config_dict, model_config_dict=None):
        super().update(config_dict, model_config_dict)
        self.rollout_balance, self.guarantee_order = rollout_balance_mode(config_dict or {}, self.rollout_balance,
                                                                          self.guarantee_order)
        for field in RESOURCE_FIELDS:
            setattr(self, field, normalize_resource(field, getattr(self, field)))
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"rl_config.placement_strategy must be one of {PLACEMENT_STRATEGIES}, "
                             f"got {self.placement_strategy!r}")
        if isinstance(self.max_nonfinite_iterations, bool) or not isinstance(self.max_nonfinite_iterations, int) \
                or self.max_nonfinite_iterations < 0:
            raise ValueError(f"rl_config.max_nonfinite_iterations must be an int >= 0, "
                             f"got {self.max_nonfinite_iterations!r}")
        for key in ("max_failed_reward_iterations", "max_all_rejected_iterations"):
            if getattr(self, key) < 0:
                raise ValueError(f"rl_config.{key} must be an int >= 0, got {getattr(self, key)!r}")
        if self.stage_timeout is not None and (isinstance(self.stage_timeout, bool) or not isinstance(
                self.stage_timeout, (int, float)) or self.stage_timeout <= 0):
            raise ValueError(f"rl_config.stage_timeout must be a number of seconds > 0 (or null), "
                             f"got {self.stage_timeout!r}")


ROLLOUT_BALANCE = ("queue", "static")
# upstream's names of our keys: resolved here, the code reads the key they name
KEY_ALIASES = {"guarantee_order": "rollout_balance"}


def rollout_balance_mode(given: dict, rollout_balance, guarantee_order):
    """(rollout_balance, guarantee_order) agreed: the key given wins; both given must agree."""
    if rollout_balance not in ROLLOUT_BALANCE:
        raise ValueError(f"rl_config.rollout_balance must be one of {ROLLOUT_BALANCE}, got {rollout_balance!r}")
    given = {str(k).replace("-", "_") for k in given}
    static = rollout_balance == "static"
    if "guarantee_order" in given and "rollout_balance" in given and bool(guarantee_order) != static:
        raise ValueError(f"rl_config.guarantee_order={guarantee_order} and rollout_balance={rollout_balance!r} "
                         f"disagree: guarantee_order is upstream's name of rollout_balance 'static'; give one")
    if "guarantee_order" in given and "rollout_balance" not in given:
        static = bool(guarantee_order)
    return ("static" if static else "queue"), static

