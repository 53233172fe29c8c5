"""Checks across the config objects before the run plan is built, and upstream's ``validate_rl_args``.

Every failure raises ValueError whose message names the offending fields. The layout and every derived number
come from ``run_plan.build_run_plan``. Nothing here requires bf16 or a particular inference engine.
"""
import warnings

from mindspeed_rl.algorithms import ADV_ESTIMATORS
from mindspeed_rl.config_cls.rl_config import DP_BALANCE_METHODS, DP_BALANCE_OBJECTIVES
from mindspeed_rl.plan.run_plan import build_run_plan


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _check_rl_scalars(rl_config):
    if rl_config.dp_balance_objective not in DP_BALANCE_OBJECTIVES:
        raise ValueError(f"rl_config.dp_balance_objective must be one of "
                         f"{DP_BALANCE_OBJECTIVES}, got {rl_config.dp_balance_objective!r}")
    if rl_config.dp_balance_method not in DP_BALANCE_METHODS:
        raise ValueError(f"rl_config.dp_balance_method must be one of "
                         f"{DP_BALANCE_METHODS}, got {rl_config.dp_balance_method!r}")
    ADV_ESTIMATORS.canonical(rl_config.adv_estimator)  # a registered estimator (ValueError naming the known ones)
    if rl_config.n_samples_per_prompt < 1:
        raise ValueError(f"rl_config.n_samples_per_prompt must be >= 1, "
                         f"got {rl_config.n_samples_per_prompt}")
    if rl_config.max_prompt_length <= 0:
        raise ValueError(f"rl_config.max_prompt_length must be > 0, "
                         f"got {rl_config.max_prompt_length}")
    if rl_config.td_timeout <= 0:
        raise ValueError(f"rl_config.td_timeout must be > 0 seconds, got {rl_config.td_timeout}")
    if rl_config.use_dynamic_bsz and rl_config.max_packing_token_size <= 0:
        raise ValueError("rl_config.use_dynamic_bsz needs rl_config.max_packing_token_size > 0, "
                         f"got {rl_config.max_packing_token_size}")
    _positive_int(rl_config.mini_batch_size, "rl_config.mini_batch_size")
    if len(rl_config.verifier_function) != len(rl_config.verifier_weight):
        raise ValueError(
            f"rl_config.verifier_function has {len(rl_config.verifier_function)} entries "
            f"but rl_config.verifier_weight has {len(rl_config.verifier_weight)}")


def _check_worker_mode(rl_config):
    if rl_config.use_integrated_worker:
        if rl_config.reference_resource is not None:
            raise ValueError("rl_config.reference_resource must not be set when "
                             "rl_config.use_integrated_worker is true")
        if rl_config.reward_resource is not None:
            raise ValueError("rl_config.reward_resource must not be set when "
                             "rl_config.use_integrated_worker is true (no reward model)")
    elif rl_config.integrated_mode_config is not None:
        raise ValueError("rl_config.integrated_mode_config must not be set when "
                         "rl_config.use_integrated_worker is false")


def check_rl_args(actor_config, rl_config, generate_config):
    """Cross-field checks of one run's configs (nothing is written; the run plan checks the layout)."""
    _check_rl_scalars(rl_config)
    for key in ("global_batch_size", "seq_length", "micro_batch_size", "train_iters"):
        _positive_int(getattr(actor_config, key), f"megatron_training.{key}")
    _positive_int(rl_config.epochs, "rl_config.epochs")
    if rl_config.max_prompt_length > actor_config.seq_length:
        raise ValueError(f"rl_config.max_prompt_length={rl_config.max_prompt_length} "
                         f"exceeds actor_config.seq_length={actor_config.seq_length}")
    if generate_config.max_model_len < actor_config.seq_length:
        raise ValueError(f"generate_config.max_model_len={generate_config.max_model_len} "
                         f"is smaller than actor_config.seq_length={actor_config.seq_length}")
    _check_worker_mode(rl_config)
    if rl_config.use_dynamic_bsz:
        longest = rl_config.max_prompt_length + generate_config.sampling_config["max_tokens"]
        if rl_config.max_packing_token_size < longest:  # upstream too fails only on such a sequence
            warnings.warn(
                f"rl_config.max_packing_token_size={rl_config.max_packing_token_size} is below the longest "
                f"possible sequence max_prompt_length + sampling_config.max_tokens = {longest}: a sequence "
                f"longer than the budget stops the run when it occurs", UserWarning, stacklevel=3)


def write_derived(plan, rl_config, generate_config) -> None:
    """Copies of the plan's numbers into the configs, for code that reads them there as upstream's does:
    ``rl_config.*_dispatch_size``, ``reference_resource`` (the actor's devices) and
    ``generate_config.data_parallel_size``. Nothing of ours reads them back."""
    for stage in plan.dp_stages:
        setattr(rl_config, stage.config_key, stage.rows_per_share)
    rl_config.reward_dispatch_size = rl_config.adv_dispatch_size = plan.rows_per_round
    if rl_config.use_integrated_worker:
        rl_config.reference_resource = rl_config.actor_resource
    generate_config.data_parallel_size = plan.layout.dp


def validate_rl_args(actor_config, ref_config, reward_config, rl_config, generate_config, critic_config=None):
    """Upstream's entry point, as upstream's behaves: check the configs, then fill the derived values in
    (``write_derived``); here it also returns the run plan those values come from."""
    check_rl_args(actor_config, rl_config, generate_config)
    plan = build_run_plan(actor_config, rl_config, generate_config, critic_config)
    write_derived(plan, rl_config, generate_config)
    return plan
