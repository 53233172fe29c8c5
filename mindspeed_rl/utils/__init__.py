"""Shared utilities."""
from mindspeed_rl._lazy import lazy_exports

_UTILS = "mindspeed_rl.utils.utils"
_EXPORTS = {
    "get_tokenizer": "mindspeed_rl.utils.tokenizer",
    "Loggers": "mindspeed_rl.utils.loggers",
    "Metric": "mindspeed_rl.utils.metrics",
    "get_batch_metrices_mean": _UTILS,
    "num_floating_point_operations": _UTILS,
    "seed_all": _UTILS,
    "synchronize_time": _UTILS,
    "get_tune_attention_mask": _UTILS,
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
