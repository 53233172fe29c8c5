"""Agent tools (upstream's package path: ``mindspeed_rl.tools.<module>.<Class>`` in a tool config YAML).

``balance_report`` and ``memory_plan`` here are the old paths of the reports (``mindspeed_rl.reports``), kept so
their ``python -m`` commands still work."""
from mindspeed_rl._lazy import lazy_exports

# upstream's package exports, imported on first use
_EXPORTS = {
    "BaseTool": "mindspeed_rl.tools.base_tool",
    "SandboxFusionTool": "mindspeed_rl.tools.sandbox_fusion_tool",
    "ReTool": "mindspeed_rl.tools.retool",
    "SearchTool": "mindspeed_rl.tools.search_tool",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
