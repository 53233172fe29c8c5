"""Model families: everything that differs between the model families the engine runs (transformers' own causal
LM classes), one module per family. A family module defines a ``Family`` and registers it; the registry finds
every module in this folder, so adding a family is one module here plus its test.

What a family holds: its HF ``model_type`` and ``architectures`` entry, the rule that picks it from a model
section's Megatron-style keys, the keys it maps to HF attributes on top of the common ones, whether q/k/v carry
a bias, the KV head count HF builds, the sizes tensor parallelism must divide, the head size vLLM builds, the
checks of keys it cannot take, what vLLM would build differently, and the shape of its tiny test model. Pure
data and small functions: nothing here imports the rest of the package.
"""
import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

Sizes = List[Tuple[str, Optional[int]]]


def _never(cfg) -> Optional[str]:
    return None


def _gqa_kv_heads(cfg) -> int:
    return cfg.num_query_groups if cfg.group_query_attention else cfg.num_attention_heads


def attention_tp_sizes(cfg) -> Sizes:
    """Attention and KV heads: what every family without MLA splits over TP."""
    return [("num_attention_heads", cfg.num_attention_heads), ("num_query_groups", _gqa_kv_heads(cfg))]


def _heads_over_tp(cfg, splits_attention) -> Sizes:
    """The heads and the dense MLP: what a dense family's TP plan splits."""
    return attention_tp_sizes(cfg) + [("ffn_hidden_size", cfg.ffn_hidden_size)]


def hidden_over_heads(cfg) -> Optional[int]:
    heads, hidden = getattr(cfg, "num_attention_heads", None), getattr(cfg, "hidden_size", None)
    return hidden // heads if hidden and heads else None


def _kv_channels_head(cfg) -> Optional[int]:
    """vLLM's head size for families that honour kv_channels (head_dim), else hidden / heads."""
    return getattr(cfg, "kv_channels", None) or hidden_over_heads(cfg)


@dataclass(frozen=True)
class Family:
    name: str                                   # HF model_type
    architecture: str                           # config.json ``architectures`` entry
    priority: int                               # picks are tried highest first; the default family has 0
    picks: Callable[[object], bool]             # does this model section (Megatron keys) describe the family
    mapped: Dict[str, str] = field(default_factory=dict)  # megatron key -> HF attribute, on top of the common ones
    qkv_bias: bool = False
    kv_heads: Callable[[object], int] = _gqa_kv_heads           # HF num_key_value_heads of a model section
    tp_sizes: Callable[[object, Callable[[str], bool]], Sizes] = _heads_over_tp  # (cfg, splits_attention)
    vllm_head_size: Callable[[object], Optional[int]] = _kv_channels_head       # None: sizes differ per part
    key_error: Callable[[object], Optional[str]] = _never       # a key value the family's HF model cannot take
    vllm_error: Callable[[object], Optional[str]] = _never      # why vLLM would build another model than HF
    tiny: Dict[str, object] = field(default_factory=dict)       # tiny test model: HF fields over the common shape


_FAMILIES: Dict[str, Family] = {}


def register(family: Family) -> Family:
    if _FAMILIES.get(family.name, family) is not family:
        raise ValueError(f"model family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family
    return family


def _load() -> Dict[str, Family]:
    if not _FAMILIES:
        for module in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{module.name}")
    return _FAMILIES


def families() -> Dict[str, Family]:
    """Every family by HF model_type."""
    return dict(_load())


def family(name: str) -> Family:
    known = _load()
    if name not in known:
        raise ValueError(f"unknown model family {name!r}; known: {sorted(known)}")
    return known[name]


def pick(cfg) -> Family:
    """The family a model section describes: the highest-priority family whose rule holds."""
    for fam in sorted(_load().values(), key=lambda f: -f.priority):
        if fam.picks(cfg):
            return fam
    raise ValueError("no model family matches the model section")  # the default family always does
