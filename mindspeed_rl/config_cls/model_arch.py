"""Architecture keys of a model section (configs/model/<name>.yaml) and what they do.

The engine runs transformers' own causal LM classes. The family is picked
from the model section's Megatron-style keys (``model_family``, by the rules of
mindspeed_rl/families/: ``multi_latent_attention`` (or ``q_lora_rank``/``kv_lora_rank``)
-> DeepSeek-V3, ``num_experts`` -> Qwen3-MoE, ``qk_layernorm`` -> Qwen3,
``add_qkv_bias`` -> Qwen2, otherwise Llama). Without a model section it comes from the
checkpoint's ``config.json`` (``architectures``). A model section either
builds the tiny random checkpoint (``--tiny-model-dir``) or is checked against
the checkpoint at ``model_path``: a key that disagrees with the checkpoint's
``config.json`` (the family included) is an error naming both values. Keys
whose value the HF model cannot take are refused.

MoE and MLA keys are read with ``getattr`` and a default, so a MegatronConfig
without those fields still works.
"""
import json
import os
from typing import Dict

from mindspeed_rl.families import families, family as family_of, pick

# megatron key -> HF config attribute, every family (init_method_std only builds the tiny checkpoint)
MAPPED = {
    "num_layers": "num_hidden_layers",
    "hidden_size": "hidden_size",
    "ffn_hidden_size": "intermediate_size",
    "num_attention_heads": "num_attention_heads",
    "max_position_embeddings": "max_position_embeddings",
    "rotary_base": "rope_theta",
    "norm_epsilon": "rms_norm_eps",
    "attention_dropout": "attention_dropout",
    "init_method_std": "initializer_range",
}
# keys that pick the family
FAMILY_KEYS = ("multi_latent_attention", "qk_layernorm")
# keys folded into other HF attributes: GQA -> num_key_value_heads, vocab -> vocab_size,
# untie -> tie_word_embeddings (see hf_config_kwargs)
DERIVED = ("group_query_attention", "num_query_groups", "vocab_size", "padded_vocab_size",
           "make_vocab_size_divisible_by", "untie_embeddings_and_output_weights")
# every family's HF model has exactly these
FIXED = {"position_embedding_type": "rope", "normalization": "RMSNorm", "swiglu": True,
         "disable_bias_linear": True, "hidden_dropout": 0.0, "attention_softmax_in_fp32": True}
# every family's own keys (mindspeed_rl/families/: its mapped keys, its q/k/v bias) come from the registry
ARCH_KEYS = tuple(dict.fromkeys(tuple(MAPPED) + tuple(k for f in families().values() for k in f.mapped)
                                + FAMILY_KEYS + DERIVED + tuple(FIXED) + ("add_qkv_bias",)))


def has_model_section(cfg) -> bool:
    return cfg.num_layers is not None


def model_family(cfg) -> str:
    """HF model_type of the model section: the family whose rule holds (mindspeed_rl/families/)."""
    return pick(cfg).name


def checkpoint_family(model_path: str) -> str:
    """HF model_type of a checkpoint folder, from config.json (model_type, else architectures)."""
    path = os.path.join(model_path, "config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("model_type"):
        return cfg["model_type"]
    arch = (cfg.get("architectures") or [None])[0]
    for name, fam in families().items():
        if fam.architecture == arch:
            return name
    raise ValueError(f"{path}: no model_type and unknown architectures={cfg.get('architectures')!r}; "
                     f"known: {sorted(f.architecture for f in families().values())}")


def check_fixed(cfg, error_cls=ValueError):
    """Refuse values the family's HF model cannot take (only with a model section)."""
    if not has_model_section(cfg):
        return
    family = model_family(cfg)
    wanted_all = dict(FIXED, add_qkv_bias=family_of(family).qkv_bias)
    for key, wanted in wanted_all.items():
        value = getattr(cfg, key, None)
        if key == "attention_softmax_in_fp32" and value is False:
            continue  # HF computes the softmax in fp32 either way
        if value != wanted:
            raise error_cls(f"model key {key}={value!r} is not supported: the model section describes a "
                            f"{family_of(family).architecture} (transformers), which needs {key}={wanted!r}")
    problem = family_of(family).key_error(cfg)
    if problem:
        raise error_cls(problem)


def hf_config_kwargs(cfg) -> Dict:
    """HF config keyword arguments given by the model section, with ``model_type`` (the family)."""
    if not has_model_section(cfg):
        return {}
    family = model_family(cfg)
    mapped = dict(MAPPED, **family_of(family).mapped)
    out = {"model_type": family}
    out.update({hf: getattr(cfg, k) for k, hf in mapped.items() if getattr(cfg, k, None) is not None})
    out["num_key_value_heads"] = family_of(family).kv_heads(cfg)
    vocab = cfg.padded_vocab_size
    if vocab is None and cfg.vocab_size is not None:
        step = max(1, cfg.make_vocab_size_divisible_by)
        vocab = -(-cfg.vocab_size // step) * step
    if vocab is not None:
        out["vocab_size"] = vocab
    out["tie_word_embeddings"] = not cfg.untie_embeddings_and_output_weights
    return out


def check_against_checkpoint(cfg, model_path: str, error_cls=ValueError):
    """Every architecture value of the model section must match the checkpoint's config.json."""
    wanted = hf_config_kwargs(cfg)
    path = os.path.join(model_path, "config.json")
    if not wanted or not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        actual = json.load(f)
    family = wanted.pop("model_type")
    have = checkpoint_family(model_path)
    if have != family:
        raise error_cls(f"the model section describes a {family_of(family).architecture} ({family}) but the checkpoint "
                        f"{path} is {have!r}: fix the model YAML (qk_layernorm, num_experts, "
                        f"multi_latent_attention, add_qkv_bias pick the family) or model_path")
    if "head_dim" not in actual and "hidden_size" in actual and "num_attention_heads" in actual:
        actual["head_dim"] = actual["hidden_size"] // actual["num_attention_heads"]
    rope = actual.get("rope_parameters") or actual.get("rope_scaling") or {}
    if "rope_theta" not in actual and isinstance(rope, dict) and "rope_theta" in rope:
        actual["rope_theta"] = rope["rope_theta"]  # transformers 5 keeps theta in rope_parameters
    actual.setdefault("tie_word_embeddings", True)  # HF's default
    wanted.pop("initializer_range", None)
    for attr, value in wanted.items():
        if attr not in actual or actual[attr] == value or _close(actual[attr], value):
            continue
        if attr == "max_position_embeddings" and value <= actual[attr]:
            continue  # a shorter limit than the checkpoint's is fine
        raise error_cls(f"model section gives {attr}={value!r} but the checkpoint {path} has "
                        f"{actual[attr]!r}: fix the model YAML or model_path")


def _close(a, b) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= 1e-9 * max(1, abs(b))
