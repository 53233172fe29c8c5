"""Types of the config keys whose declared default is None (unset), per section.

A key with a typed default takes that default's type (base_config.check_type); a key whose default
is None takes null or one of the types listed here. Every section is checked by the same rule
before any value is compared or used (loader.build_configs), and errors name ``section.key``."""

INT, FLOAT, STR, BOOL, LIST, DICT = int, float, str, bool, list, dict

_MEGATRON = {
    **dict.fromkeys((
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "kv_channels", "vocab_size",
        "padded_vocab_size", "max_position_embeddings", "rope_scaling_original_max_position_embeddings",
        "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "num_experts",
        "moe_ffn_hidden_size", "n_shared_experts", "first_k_dense_replace", "moe_router_num_groups",
        "moe_router_group_topk", "save_interval", "global_batch_size", "seq_length", "max_prompt_length",
        "train_iters", "recompute_num_layers"), (INT,)),
    **dict.fromkeys((
        "rope_scaling_type", "moe_token_dispatcher_type", "model_path", "tokenizer_type", "tokenizer_name_or_path",
        "prompt_type", "system_prompt", "load", "save", "data_path", "stage", "recompute_granularity",
        "recompute_method"), (STR,)),
    "moe_router_topk_scaling_factor": (FLOAT,),
    "moe_layer_freq": (INT, LIST, STR),          # every n-th layer, a 0/1 list, or Megatron's expression
    "spec": (STR, LIST),                         # upstream: [module, layer-spec name]
    "split": (STR, INT),                         # '100,0,0' (a single share reads as an int)
    "num_layer_list": (STR, INT, LIST),          # '16,17,16,15'
    "noop_layers": (STR, INT, LIST),             # '5,95'
    "map_keys": (DICT,),
    "reset_attention_mask": (BOOL,),
    "no_pad_to_seq_lengths": (BOOL,),
    "lora_target_modules": (LIST, STR),
}

_RL = {
    **dict.fromkeys(("reference_resource", "reward_resource", "critic_resource", "integrated_mode_config",
                     "rollout_correction"), (DICT,)),
    **dict.fromkeys((
        "ref_forward_micro_batch_size", "actor_forward_micro_batch_size", "actor_rollout_dispatch_size",
        "actor_logprob_dispatch_size", "ref_dispatch_size", "reward_dispatch_size", "adv_dispatch_size",
        "actor_update_dispatch_size", "actor_max_packing_token_size", "update_max_packing_token_size",
        "critic_value_dispatch_size", "critic_update_dispatch_size"), (INT,)),
    **dict.fromkeys(("tool_config_path", "tool_response_truncate_side", "tool_parser_format",
                     "multi_turn_routing"), (STR,)),
    "stage_timeout": (FLOAT,),
    "loss_agg_mode": (STR,),
    "loss_scale_factor": (FLOAT,),
}

_GENERATE = {"data_parallel_size": (INT,), "expert_map_path": (STR,), "sampling_config.seed": (INT,)}

# config class name -> (section named in errors, types of its keys with a None default)
BY_CLASS = {
    "MegatronConfig": ("megatron_training", _MEGATRON),
    "RLConfig": ("rl_config", _RL),
    "GenerateConfig": ("generate_config", _GENERATE),
}


def unset_types(owner: str, key: str):
    """The types a None-default key of config class ``owner`` takes (None: any value)."""
    return BY_CLASS.get(owner, ("", {}))[1].get(key)


def section_of(owner: str) -> str:
    """The section a config class's keys are named under in errors."""
    return BY_CLASS.get(owner, (owner, {}))[0]
