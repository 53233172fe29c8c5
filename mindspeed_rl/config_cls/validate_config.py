"""Cross-field checks run once all config objects are built.

Every failure raises ValueError whose message names the offending fields.
Besides checking, ``validate_rl_args`` fills values derived from the others
(as upstream does): ``reference_resource`` in integrated mode,
``generate_config.data_parallel_size`` and the ``*_dispatch_size`` keys.
Nothing here requires bf16 or a particular inference engine.
"""
from mindspeed_rl.config_cls.rl_config import (
    DP_BALANCE_METHODS, DP_BALANCE_OBJECTIVES, resource_size)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _parallel_product(cfg):
    return (cfg.tensor_model_parallel_size * cfg.pipeline_model_parallel_size
            * cfg.context_parallel_size)


def _check_resource(field, resource, cfg, role):
    """Return the DP size of a role after checking its device count."""
    devices = resource_size(resource)
    if devices is None:
        return None
    _positive_int(devices, f"rl_config.{field}.num_npus")
    product = _parallel_product(cfg)
    if devices % product != 0:
        raise ValueError(
            f"rl_config.{field}.num_npus={devices} must be divisible by {role} "
            f"tensor_model_parallel_size * pipeline_model_parallel_size * "
            f"context_parallel_size = {product}")
    return devices // product


def _check_rl_scalars(rl_config):
    if rl_config.dp_balance_objective not in DP_BALANCE_OBJECTIVES:
        raise ValueError(f"rl_config.dp_balance_objective must be one of "
                         f"{DP_BALANCE_OBJECTIVES}, got {rl_config.dp_balance_objective!r}")
    if rl_config.dp_balance_method not in DP_BALANCE_METHODS:
        raise ValueError(f"rl_config.dp_balance_method must be one of "
                         f"{DP_BALANCE_METHODS}, got {rl_config.dp_balance_method!r}")
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
        # The reference model lives on the actor's devices.
        rl_config.reference_resource = rl_config.actor_resource
    elif rl_config.integrated_mode_config is not None:
        raise ValueError("rl_config.integrated_mode_config must not be set when "
                         "rl_config.use_integrated_worker is false")


def _check_batches(actor_config, rl_config, dp):
    n = rl_config.n_samples_per_prompt
    mini = rl_config.mini_batch_size  # already counted in samples
    total = actor_config.global_batch_size * n
    if mini % n != 0:
        raise ValueError(f"rl_config.mini_batch_size={mini} (in samples) must be a "
                         f"multiple of rl_config.n_samples_per_prompt={n}")
    if total % mini != 0:
        raise ValueError(
            f"global_batch_size * rl_config.n_samples_per_prompt = {total} must be "
            f"divisible by rl_config.mini_batch_size={mini} (in samples)")
    if dp is None:
        return
    # Every DP rank trains on an equal share of whole GRPO groups.
    if mini % dp != 0:
        raise ValueError(f"rl_config.mini_batch_size={mini} (in samples) must be "
                         f"divisible by the data parallel size {dp}")
    if (mini // dp) % n != 0:
        raise ValueError(f"rl_config.mini_batch_size // data parallel size = {mini // dp} samples must be "
                         f"whole GRPO groups (a multiple of n_samples_per_prompt={n})")
    if not rl_config.use_dynamic_bsz and (mini // dp) % actor_config.micro_batch_size != 0:
        raise ValueError(
            f"rl_config.mini_batch_size // data parallel size = {mini // dp} must be "
            f"divisible by micro_batch_size={actor_config.micro_batch_size}")


def _fill_dispatch_sizes(rl_config, total, dp, ref_dp, gen_dp, reward_dp):
    """Default each dispatch size to one rank's share and check it divides the batch."""
    defaults = {
        "actor_rollout_dispatch_size": total // gen_dp if gen_dp else None,
        "actor_logprob_dispatch_size": total // dp if dp else None,
        "ref_dispatch_size": total // ref_dp if ref_dp else None,
        "reward_dispatch_size": total // reward_dp if reward_dp else total,
        "adv_dispatch_size": total,
    }
    if not rl_config.use_integrated_worker:
        defaults["actor_update_dispatch_size"] = total // dp if dp else None
    grouped = ("actor_logprob_dispatch_size", "ref_dispatch_size", "actor_update_dispatch_size")
    for field, default in defaults.items():
        value = getattr(rl_config, field)
        if value is None:
            value = default
            setattr(rl_config, field, value)
        if value is None:
            continue
        _positive_int(value, f"rl_config.{field}")
        if total % value != 0:
            raise ValueError(f"rl_config.{field}={value} must divide global_batch_size * "
                             f"n_samples_per_prompt = {total}")
        if field in grouped and value % rl_config.n_samples_per_prompt != 0:
            raise ValueError(f"rl_config.{field}={value} must be whole GRPO groups (a multiple of "
                             f"n_samples_per_prompt={rl_config.n_samples_per_prompt})")


def validate_rl_args(actor_config, ref_config, reward_config, rl_config,
                     generate_config, dp_size=None):
    """Check the configs of one run against each other.

    ``dp_size`` is the actor's data parallel size. When omitted it is derived
    from ``rl_config.actor_resource`` and the actor's TP*PP*CP; when both are
    known they must agree.
    """
    _check_rl_scalars(rl_config)
    _positive_int(actor_config.global_batch_size, "actor_config.global_batch_size")
    _positive_int(actor_config.seq_length, "actor_config.seq_length")
    _positive_int(actor_config.micro_batch_size, "actor_config.micro_batch_size")
    if rl_config.max_prompt_length > actor_config.seq_length:
        raise ValueError(f"rl_config.max_prompt_length={rl_config.max_prompt_length} "
                         f"exceeds actor_config.seq_length={actor_config.seq_length}")
    if generate_config.max_model_len < actor_config.seq_length:
        raise ValueError(f"generate_config.max_model_len={generate_config.max_model_len} "
                         f"is smaller than actor_config.seq_length={actor_config.seq_length}")

    _check_worker_mode(rl_config)

    derived_dp = _check_resource("actor_resource", rl_config.actor_resource, actor_config, "actor")
    if dp_size is not None:
        _positive_int(dp_size, "dp_size")
        if derived_dp is not None and derived_dp != dp_size:
            raise ValueError(f"dp_size={dp_size} disagrees with rl_config.actor_resource, "
                             f"which gives a data parallel size of {derived_dp}")
    dp = dp_size if dp_size is not None else derived_dp

    ref_dp = dp
    if not rl_config.use_integrated_worker and ref_config is not None:
        ref_dp = _check_resource("reference_resource", rl_config.reference_resource,
                                 ref_config, "reference")
    reward_dp = None
    if rl_config.reward_resource is not None and reward_config is not None:
        reward_dp = _check_resource("reward_resource", rl_config.reward_resource,
                                    reward_config, "reward")

    _check_batches(actor_config, rl_config, dp)

    total = actor_config.global_batch_size * rl_config.n_samples_per_prompt
    gen_dp = None
    devices = resource_size(rl_config.actor_resource)
    if devices is not None:
        infer = (generate_config.infer_tensor_parallel_size
                 * generate_config.infer_pipeline_parallel_size)
        if devices % infer != 0:
            raise ValueError(
                f"rl_config.actor_resource.num_npus={devices} must be divisible by "
                f"generate_config.infer_tensor_parallel_size * "
                f"infer_pipeline_parallel_size = {infer}")
        gen_dp = devices // infer
        if total % gen_dp != 0:
            raise ValueError(f"global_batch_size * n_samples_per_prompt = {total} must be "
                             f"divisible by the rollout data parallel size {gen_dp}")
        generate_config.data_parallel_size = gen_dp

    _fill_dispatch_sizes(rl_config, total, dp, ref_dp, gen_dp, reward_dp)
    if rl_config.use_dynamic_bsz:
        longest = rl_config.max_prompt_length + generate_config.sampling_config["max_tokens"]
        if rl_config.max_packing_token_size < longest:
            raise ValueError(
                f"rl_config.max_packing_token_size={rl_config.max_packing_token_size} is below the longest "
                f"possible sequence max_prompt_length + sampling_config.max_tokens = {longest}")
