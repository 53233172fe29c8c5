"""Architecture keys of a model section (configs/model/<name>.yaml) and what they do.

The engine runs HF Qwen2-shaped causal LMs. A model section either builds the
tiny random checkpoint (``--tiny-model-dir``) or is checked against the
checkpoint at ``model_path``: a key that disagrees with the checkpoint's
``config.json`` is an error naming both values. Keys whose value the HF
model cannot take are refused.
"""
import json
import os
from typing import Dict

# megatron key -> HF Qwen2Config attribute (init_method_std only builds the tiny checkpoint)
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
    "kv_channels": "head_dim",
}
# keys folded into other HF attributes: GQA -> num_key_value_heads, vocab -> vocab_size,
# untie -> tie_word_embeddings (see hf_config_kwargs)
DERIVED = ("group_query_attention", "num_query_groups", "vocab_size", "padded_vocab_size",
           "make_vocab_size_divisible_by", "untie_embeddings_and_output_weights")
# the HF Qwen2 model has exactly these
FIXED = {"position_embedding_type": "rope", "normalization": "RMSNorm", "swiglu": True,
         "add_qkv_bias": True, "disable_bias_linear": True, "hidden_dropout": 0.0,
         "attention_softmax_in_fp32": True}
ARCH_KEYS = tuple(MAPPED) + DERIVED + tuple(FIXED)


def has_model_section(cfg) -> bool:
    return cfg.num_layers is not None


def check_fixed(cfg, error_cls=ValueError):
    """Refuse values the HF Qwen2 model cannot take (only with a model section)."""
    if not has_model_section(cfg):
        return
    for key, wanted in FIXED.items():
        value = getattr(cfg, key)
        if key == "attention_softmax_in_fp32" and value is False:
            continue  # HF computes the softmax in fp32 either way
        if value != wanted:
            raise error_cls(f"model key {key}={value!r} is not supported: the engine runs HF Qwen2-shaped "
                            f"models, which need {key}={wanted!r}")


def hf_config_kwargs(cfg) -> Dict:
    """Qwen2Config keyword arguments given by the model section."""
    if not has_model_section(cfg):
        return {}
    out = {MAPPED[k]: getattr(cfg, k) for k in MAPPED if getattr(cfg, k) is not None}
    out["num_key_value_heads"] = cfg.num_query_groups if cfg.group_query_attention else cfg.num_attention_heads
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
    if "head_dim" not in actual and "hidden_size" in actual and "num_attention_heads" in actual:
        actual["head_dim"] = actual["hidden_size"] // actual["num_attention_heads"]
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
