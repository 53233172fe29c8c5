"""Upstream config keys this implementation accepts but does not carry out.

One table, the only list: a value other than the default makes ``check_keys``
warn once (what happens instead) or, where ignoring it would change results,
raise ``ConfigError``. The table in docs/reference/configuration.md is generated from here:
``python -m mindspeed_rl.config_cls.unimplemented``.
"""
import warnings
from dataclasses import dataclass
from typing import Callable, List, Optional

WARN, ERROR = "warn", "error"
_HF_ROLLOUT = ("rollout_backend=hf samples with transformers generate, one batch per take of "
               "actor_rollout_dispatch_size rows; the key acts with rollout_backend vllm (or auto with vLLM installed)")
_NO_FUSION = "the HF model's own kernels run; no fused/Ascend kernels"
_LORA = "not implemented yet: every weight is trained (full-parameter GRPO; the memory plan counts full AdamW state)"
_MOE_KERNELS = "MoE layers run as transformers implements them; experts are sharded by FSDP, no token dispatcher"
_ROPE = ("rope scaling is the checkpoint's config.json's (not compared with the model section); "
         "a tiny checkpoint built from the section has none")
_VLLM = "a vLLM-Ascend option; the vLLM backend passes no Ascend settings"


def _hf(values):
    return values.get("rollout_backend") == "hf"


def _moe(values):
    return bool(values.get("num_experts"))


_NO_WANDB = "no effect while rl_config.use_wandb is false (use_wandb: true logs the metrics to Weights & Biases)"


def _no_wandb(values):
    return not values.get("use_wandb")


@dataclass(frozen=True)
class Key:
    section: str      # rl_config, megatron_training, generate_config, sampling_config
    name: str
    action: str       # WARN or ERROR
    instead: str      # what happens instead
    # value -> True when it asks for something not implemented; default: value != declared default
    ignored: Optional[Callable] = None
    # section values -> False when the key does not apply (e.g. MoE keys of a dense model)
    applies: Optional[Callable] = None


def _group_norm(values) -> bool:
    return values.get("adv_estimator") != "gae"


KEYS: List[Key] = [
    # ---- rl_config
    Key("rl_config", "runtime_env_path", WARN,
        "no runtime env file is read; workers inherit their Ray node's environment (the driver's on a local Ray)"),
    Key("rl_config", "beta", WARN, "the KL weight is rl_config.init_kl_coef"),
    Key("rl_config", "num_samples_per_step", WARN, "no effect"),
    Key("rl_config", "advantage_whiten", ERROR,
        "advantages are always normalised (GRPO within each group, PPO's GAE over the batch)"),
    Key("rl_config", "gamma", WARN, "group_norm advantages use no discount (GAE, adv_estimator: gae, does)",
        applies=_group_norm),
    Key("rl_config", "lam", WARN, "group_norm advantages use no GAE (adv_estimator: gae does)", applies=_group_norm),
    Key("rl_config", "cliprange_value", WARN, "only PPO (stage ray_ppo) has a critic", applies=_group_norm),
    Key("rl_config", "integrated_mode_config", WARN, "no effect"),
    Key("rl_config", "shuffle_mini_batch", WARN,
        "mini-batches are the shares of the round's plan (balanced, or a seeded random split)"),
    Key("rl_config", "enable_sharding_validate", WARN, "no resharding, nothing to validate"),
    Key("rl_config", "tp_split_expert", WARN, "MoE experts (Qwen3-MoE, DeepSeek-V3) are sharded by FSDP and "
        "replicated over TP, never split over TP"),
    Key("rl_config", "wandb_project", WARN, _NO_WANDB, applies=_no_wandb),
    Key("rl_config", "wandb_exp_name", WARN, _NO_WANDB, applies=_no_wandb),
    Key("rl_config", "wandb_save_dir", WARN, _NO_WANDB, applies=_no_wandb),
    Key("rl_config", "blocking", WARN, "stages always run one after another", lambda v: v is False),
    Key("rl_config", "num_cpus_for_local_task", WARN, "driver-side stages run in the driver process"),
    Key("rl_config", "num_cpus_for_placement_group", WARN,
        "each worker's bundle asks for 1 CPU with an accelerator, 0.5 without"),
    Key("rl_config", "use_integrated_worker", ERROR, "only the integrated worker (actor + reference + rollout)",
        lambda v: v is False),
    Key("rl_config", "reward_dispatch_size", WARN, "rule rewards run on the driver over the whole batch"),
    Key("rl_config", "adv_dispatch_size", WARN, "advantages run on the driver over the whole batch"),
    Key("rl_config", "is_multimodal", ERROR, "multimodal policies are not implemented"),
    Key("rl_config", "rule_reward", ERROR, "rewards come from the rule verifiers only (no reward model)",
        lambda v: v is False),
    Key("rl_config", "hccl_buffersize", WARN, "no HCCL buffer is sized; collectives use torch.distributed defaults"),
    Key("rl_config", "zmq_communication", WARN, "data moves through the Ray transfer dock"),
    Key("rl_config", "log_max_throughput", WARN, "no max-throughput metric; per-stage timings are logged"),
    Key("rl_config", "actor_max_packing_token_size", WARN,
        "every pass packs micro-batches up to max_packing_token_size (same math, memory per micro-batch differs)",
        lambda v: v is not None),
    Key("rl_config", "update_max_packing_token_size", WARN,
        "every pass packs micro-batches up to max_packing_token_size (same math, memory per micro-batch differs)",
        lambda v: v is not None),
    Key("rl_config", "share_backbone", WARN, "no LoRA, so nothing to share"),
    # ---- megatron_training / role sections
    Key("megatron_training", "use_mcore_models", WARN, "the model is the HF transformers implementation"),
    Key("megatron_training", "tokenizer_type", WARN, "the tokenizer is loaded with transformers' AutoTokenizer",
        lambda v: v not in (None, "PretrainedFromHF")),
    Key("megatron_training", "tokenizer_padding_side", WARN, "padding is handled inside the engine"),
    Key("megatron_training", "tokenizer_not_use_fast", WARN, "AutoTokenizer picks the tokenizer class"),
    Key("megatron_training", "context_parallel_algo", WARN, "no context parallelism"),
    Key("megatron_training", "sequence_parallel", WARN, "no sequence parallelism; activations stay whole on TP peers"),
    Key("megatron_training", "full_shuffle_instruction_dataset", WARN,
        "each epoch is shuffled on its own, with seed + epoch"),
    Key("megatron_training", "num_workers", WARN, "prompts are read in the driver"),
    Key("megatron_training", "variable_seq_lengths", WARN, "sequence lengths always vary (packed or padded)"),
    Key("megatron_training", "reset_position_ids", WARN,
        "packed sequences always restart their positions", lambda v: v is False),
    Key("megatron_training", "stage", ERROR, "only GRPO ('ray_grpo'), DAPO ('ray_dapo') and PPO ('ray_ppo') are "
        "implemented", lambda v: v not in (None, "ray_grpo", "ray_dapo", "ray_ppo")),
    Key("megatron_training", "attention_mask_type", ERROR, "attention is causal", lambda v: v != "causal"),
    Key("megatron_training", "reset_attention_mask", WARN,
        "packed samples never attend to each other (as with reset_attention_mask: true)", lambda v: v is False),
    Key("megatron_training", "no_pad_to_seq_lengths", WARN,
        "sequences are never padded to seq_length (as with no_pad_to_seq_lengths: true)", lambda v: v is False),
    Key("megatron_training", "recompute_granularity", WARN,
        "no activation recomputation (memory_plan's activation estimate assumes none)"),
    Key("megatron_training", "recompute_method", WARN, "no activation recomputation"),
    Key("megatron_training", "recompute_num_layers", WARN, "no activation recomputation"),
    Key("megatron_training", "swap_optimizer", WARN, "optimizer state stays on the device"),
    Key("megatron_training", "reuse_fp32_param", WARN, "fp32 master weights are kept as FSDP/DDP keep them"),
    Key("megatron_training", "shape_order", WARN, _NO_FUSION),
    Key("megatron_training", "gemm_gradient_accumulation_fusion", WARN, _NO_FUSION),
    Key("megatron_training", "lora_target_modules", WARN, _LORA, lambda v: bool(v)),
    Key("megatron_training", "lora_r", WARN, _LORA),
    Key("megatron_training", "lora_alpha", WARN, _LORA),
    Key("megatron_training", "lora_fusion", WARN, _LORA),
    Key("megatron_training", "lora_ckpt_filter", WARN, _LORA),
    Key("megatron_training", "spec", WARN, "the transformers class of the model family is used"),
    Key("megatron_training", "moe_grouped_gemm", WARN, _MOE_KERNELS),
    Key("megatron_training", "moe_permutation_async_comm", WARN, _MOE_KERNELS),
    Key("megatron_training", "moe_token_dispatcher_type", WARN, _MOE_KERNELS),
    Key("megatron_training", "use_fused_moe_token_permute_and_unpermute", WARN, _MOE_KERNELS),
    Key("megatron_training", "moe_tp_extend_ep", WARN, _MOE_KERNELS),
    Key("megatron_training", "moe_alltoall_overlap_comm", WARN, _MOE_KERNELS),
    Key("megatron_training", "moe_aux_loss_coeff", WARN,
        "not implemented yet: no router load-balancing loss is added to the GRPO loss", lambda v: v > 0, _moe),
    Key("megatron_training", "moe_router_load_balancing_type", WARN,
        "not implemented yet: no router load-balancing loss is added to the GRPO loss", lambda v: v != "none",
        _moe),
    Key("megatron_training", "seq_aux", WARN, "not implemented yet: no sequence-level router loss"),
    Key("megatron_training", "attention_bias", WARN, "q/k/v carry a bias only as add_qkv_bias says; no output bias"),
    Key("megatron_training", "rope_scaling_type", WARN, _ROPE),
    Key("megatron_training", "rope_scaling_factor", WARN, _ROPE),
    Key("megatron_training", "rope_scaling_mscale", WARN, _ROPE),
    Key("megatron_training", "rope_scaling_mscale_all_dim", WARN, _ROPE),
    Key("megatron_training", "rope_scaling_original_max_position_embeddings", WARN, _ROPE),
    Key("megatron_training", "beta_fast", WARN, _ROPE),
    Key("megatron_training", "beta_slow", WARN, _ROPE),
    Key("megatron_training", "moe_layer_freq", WARN, "every layer after first_k_dense_replace is MoE, as the "
        "family's transformers class lays it out", lambda v: v not in (None, 1)),
    Key("megatron_training", "moe_router_score_function", WARN, "the family's transformers class fixes the router "
        "score (Qwen3-MoE softmax, DeepSeek-V3 sigmoid)"),
    Key("megatron_training", "moe_router_enable_expert_bias", WARN,
        "not implemented yet: the expert bias routes as loaded and is not updated during training"),
    Key("megatron_training", "optimizer", ERROR, "the optimizer is AdamW", lambda v: v != "adam"),
    Key("megatron_training", "initial_loss_scale", WARN, "fp32 or bf16 training, no loss scaling"),
    Key("megatron_training", "use_fused_rmsnorm", WARN, _NO_FUSION),
    Key("megatron_training", "use_fused_swiglu", WARN, _NO_FUSION),
    Key("megatron_training", "use_fused_rotary_pos_emb", WARN, _NO_FUSION),
    Key("megatron_training", "no_masked_softmax_fusion", WARN, _NO_FUSION),
    Key("megatron_training", "no_gradient_accumulation_fusion", WARN, _NO_FUSION),
    Key("megatron_training", "no_shared_storage", WARN, "no effect"),
    Key("megatron_training", "use_ascend_coc", WARN, _NO_FUSION),
    Key("megatron_training", "coc_mode", WARN, _NO_FUSION),
    Key("megatron_training", "coc_parallel_num", WARN, _NO_FUSION),
    Key("megatron_training", "coc_fused_kernel", WARN, _NO_FUSION),
    # ---- generate_config
    Key("generate_config", "infer_expert_parallel_size", WARN, "no expert parallelism in rollout: a vLLM engine "
        "holds the whole model on its rank, transformers generate runs on the actor's layout"),
    Key("generate_config", "max_num_seqs", WARN, _HF_ROLLOUT, applies=_hf),
    Key("generate_config", "max_num_batched_tokens", WARN, _HF_ROLLOUT, applies=_hf),
    Key("generate_config", "gpu_memory_utilization", WARN, _HF_ROLLOUT, applies=_hf),
    Key("generate_config", "enable_prefix_caching", WARN, _HF_ROLLOUT, applies=_hf),
    Key("generate_config", "enforce_eager", WARN, _HF_ROLLOUT, applies=_hf),
    Key("generate_config", "dtype", WARN, "rollout_backend=hf runs in the actor's dtype (bf16 autocast when "
        "bf16: true)", applies=_hf),
    Key("generate_config", "num_scheduler_steps", WARN, "vLLM v1 schedules every step; no multi-step scheduling"),
    Key("generate_config", "offload_train_optimizer", WARN, "not implemented yet: training state stays on the device during rollout"),
    Key("generate_config", "offload_train_grad", WARN, "not implemented yet: training state stays on the device during rollout"),
    Key("generate_config", "offload_train_param", WARN, "not implemented yet: training state stays on the device during rollout"),
    Key("generate_config", "torchair_graph", WARN, _VLLM),
    Key("generate_config", "enable_expert_parallel", WARN, _VLLM),
    Key("generate_config", "expert_map_path", WARN, _VLLM),
    Key("generate_config", "ascend_scheduler_config_enabled", WARN, _VLLM),
    Key("sampling_config", "logprobs", WARN, "rollout_backend=hf returns the sampled tokens' log-probs only for "
        "rollout correction and partial rollout (with vLLM always: actor/rollout_log_prob_*); the trainer recomputes "
        "log-probs", applies=_hf),
    Key("sampling_config", "detokenize", WARN, "rollout returns token ids only"),
]

# keys checked in the run plan instead (they change the layout): PP, CP, EP, infer PP


def _values(section, actor_config, rl_config, generate_config):
    """(object's current values, declared defaults) of a section."""
    from mindspeed_rl.config_cls.generate_config import SAMPLING_DEFAULTS
    if section == "sampling_config":
        # the backend decides whether a sampling key acts
        backend = getattr(generate_config, "rollout_backend", "auto")
        return {**generate_config.sampling_config, "rollout_backend": backend}, SAMPLING_DEFAULTS
    obj = {"rl_config": rl_config, "megatron_training": actor_config, "generate_config": generate_config}[section]
    return obj.dict(), obj._declared_defaults()


def check_keys(actor_config, rl_config, generate_config, error_cls=ValueError) -> List[str]:
    """Warn for each table key given a value that is not carried out; raise
    ``error_cls`` for the first that would change results. Returns the warnings."""
    messages = []
    for key in KEYS:
        values, defaults = _values(key.section, actor_config, rl_config, generate_config)
        if key.applies is not None and not key.applies(values):
            continue
        value = values.get(key.name)
        ignored = key.ignored(value) if key.ignored else value != defaults.get(key.name)
        if not ignored:
            continue
        text = f"{key.section}.{key.name}={value!r} is not implemented: {key.instead}"
        if key.action == ERROR:
            raise error_cls(text)
        messages.append(text)
    for text in messages:
        warnings.warn(text, UserWarning, stacklevel=2)
    return messages


def markdown_table() -> str:
    rows = ["| key | when set | what happens instead |", "| --- | --- | --- |"]
    for key in KEYS:
        rows.append(f"| `{key.section}.{key.name}` | {'error' if key.action == ERROR else 'warning'} "
                    f"| {key.instead} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
