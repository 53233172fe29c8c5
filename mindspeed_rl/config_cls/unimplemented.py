"""Upstream config keys this implementation accepts but does not carry out.

One table, the only list: a value other than the default makes ``check_keys``
warn once (what happens instead) or, where ignoring it would change results,
raise ``ConfigError``. The README's table is generated from here:
``python -m mindspeed_rl.config_cls.unimplemented``.
"""
import warnings
from dataclasses import dataclass
from typing import Callable, List, Optional

WARN, ERROR = "warn", "error"
_HF_ROLLOUT = "rollout samples with HF generate over the rank's whole share"
_NO_FUSION = "the HF model's own kernels run; no fused/Ascend kernels"


@dataclass(frozen=True)
class Key:
    section: str      # rl_config, megatron_training, generate_config, sampling_config
    name: str
    action: str       # WARN or ERROR
    instead: str      # what happens instead
    # value -> True when it asks for something not implemented; default: value != declared default
    ignored: Optional[Callable] = None


KEYS: List[Key] = [
    # ---- rl_config
    Key("rl_config", "runtime_env_path", WARN, "no runtime env file is read; workers inherit the driver's environment"),
    Key("rl_config", "beta", WARN, "the KL weight is rl_config.init_kl_coef"),
    Key("rl_config", "num_samples_per_step", WARN, "no effect"),
    Key("rl_config", "advantage_whiten", ERROR, "advantages are always normalised within each GRPO group"),
    Key("rl_config", "gamma", WARN, "group_norm advantages use no discount"),
    Key("rl_config", "lam", WARN, "group_norm advantages use no GAE"),
    Key("rl_config", "integrated_mode_config", WARN, "no effect"),
    Key("rl_config", "shuffle_mini_batch", WARN,
        "mini-batches are the shares of the round's plan (balanced, or a seeded random split)"),
    Key("rl_config", "enable_sharding_validate", WARN, "no resharding, nothing to validate"),
    Key("rl_config", "tp_split_expert", WARN, "no MoE support"),
    Key("rl_config", "use_wandb", WARN, "metrics go to metrics.jsonl and TensorBoard"),
    Key("rl_config", "wandb_project", WARN, "no wandb"),
    Key("rl_config", "wandb_exp_name", WARN, "no wandb"),
    Key("rl_config", "wandb_save_dir", WARN, "no wandb"),
    Key("rl_config", "blocking", WARN, "stages always run one after another", lambda v: v is False),
    Key("rl_config", "guarantee_order", WARN, "rows are served by the round's plan, bound to DP ranks"),
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
    Key("megatron_training", "stage", ERROR, "only GRPO ('ray_grpo') is implemented",
        lambda v: v not in (None, "ray_grpo")),
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
    Key("generate_config", "infer_expert_parallel_size", WARN, "no MoE support"),
    Key("generate_config", "max_num_seqs", WARN, _HF_ROLLOUT),
    Key("generate_config", "max_num_batched_tokens", WARN, _HF_ROLLOUT),
    Key("generate_config", "gpu_memory_utilization", WARN, _HF_ROLLOUT),
    Key("generate_config", "enable_prefix_caching", WARN, _HF_ROLLOUT),
    Key("generate_config", "num_scheduler_steps", WARN, _HF_ROLLOUT),
    Key("generate_config", "enforce_eager", WARN, _HF_ROLLOUT),
    Key("generate_config", "dtype", WARN, "rollout runs in the actor's dtype (bf16 autocast when bf16: true)"),
    Key("generate_config", "offload_train_optimizer", WARN, "training state stays on the device during rollout"),
    Key("generate_config", "offload_train_grad", WARN, "training state stays on the device during rollout"),
    Key("generate_config", "offload_train_param", WARN, "training state stays on the device during rollout"),
    Key("sampling_config", "logprobs", WARN, "rollout returns tokens only; log-probs are recomputed"),
    Key("sampling_config", "detokenize", WARN, "rollout returns token ids only"),
]

# keys checked in the run plan instead (they change the layout): PP, CP, EP, infer PP
TABLE_SECTIONS = ("rl_config", "megatron_training", "generate_config", "sampling_config")


def _values(section, actor_config, rl_config, generate_config):
    """(object's current values, declared defaults) of a section."""
    from mindspeed_rl.config_cls.generate_config import SAMPLING_DEFAULTS
    if section == "sampling_config":
        return generate_config.sampling_config, SAMPLING_DEFAULTS
    obj = {"rl_config": rl_config, "megatron_training": actor_config, "generate_config": generate_config}[section]
    return obj.dict(), obj._declared_defaults()


def check_keys(actor_config, rl_config, generate_config, error_cls=ValueError) -> List[str]:
    """Warn for each table key given a value that is not carried out; raise
    ``error_cls`` for the first that would change results. Returns the warnings."""
    messages = []
    for key in KEYS:
        values, defaults = _values(key.section, actor_config, rl_config, generate_config)
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
