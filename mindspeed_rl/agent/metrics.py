"""One rank's multi-turn figures of a rollout stage, from what its engine served."""
from typing import Dict


def turn_metrics(served) -> Dict[str, float]:
    stats, masks = served.turn_stats or [], served.masks or []
    rows = max(1, len(stats))
    tokens = sum(int(m.numel()) for m in masks)
    model = sum(int(m.sum()) for m in masks)
    out = {
        "multi_turn/turns_per_row": sum(s["turns"] for s in stats) / rows,
        "multi_turn/tool_calls_per_row": sum(s["tool_calls"] for s in stats) / rows,
        "multi_turn/rows_with_tool_calls": sum(s["tool_calls"] > 0 for s in stats) / rows,
        "multi_turn/tool_errors": float(sum(s["tool_errors"] for s in stats)),
        "multi_turn/tool_timeouts": float(sum(s["tool_timeouts"] for s in stats)),
        "multi_turn/tool_seconds": float(sum(s["tool_seconds"] for s in stats)),
        # the engine had nothing to run while it waited on tools
        "multi_turn/engine_tool_wait_seconds": float(served.tool_wait),
        "multi_turn/tool_token_fraction": (tokens - model) / tokens if tokens else 0.0,
    }
    for reason in sorted({s["stop"] for s in stats}):
        out[f"multi_turn/ended_{reason}"] = sum(s["stop"] == reason for s in stats) / rows
    return out
