"""Multi-turn figures of a rollout stage: each rank counts what its engine served (``turn_counts``), the driver
adds the ranks up into per-row rates (``turn_metrics``)."""
from typing import Dict, List

from mindspeed_rl.agent.conversation import CUT

PREFIX = "multi_turn/"


def turn_counts(served) -> Dict[str, float]:
    """One rank's counts (``multi_turn/count/<name>``), summed over its rows. Partial rollout: each pass counts
    the work it did (its turns, calls, tokens), and a conversation counts as a row in the pass that ends it."""
    stats, masks = served.turn_stats or [], served.masks or []
    ended = [s for s in stats if s["stop"] != CUT]
    tokens = sum(int(m.numel()) for m in masks)
    out = {"rows": len(ended), "turns": sum(s["turns"] for s in stats),
           "tool_calls": sum(s["tool_calls"] for s in stats), "tool_rounds": sum(s["tool_rounds"] for s in stats),
           "rows_with_tool_calls": sum(bool(s["called"]) for s in ended),
           "tool_errors": sum(s["tool_errors"] for s in stats), "tool_timeouts": sum(s["tool_timeouts"] for s in stats),
           "tool_skipped": sum(s["tool_skipped"] for s in stats),
           "tool_seconds": sum(s["tool_seconds"] for s in stats),
           "turns_moved": sum(s["moved"] for s in stats),
           # the engine had nothing to run while it waited on tools
           "engine_tool_wait_seconds": served.tool_wait,
           # seconds a row of the engine's waited on a tool, those of them the engine stepped, its serve seconds
           "tools_running_seconds": served.tool_running, "engine_busy_while_tools_seconds": served.tool_busy,
           "serve_seconds": served.busy,
           "tokens": tokens, "tool_tokens": tokens - sum(int(m.sum()) for m in masks)}
    for s in ended:
        key = f"ended_{s['stop']}"
        out[key] = out.get(key, 0) + 1
    return {f"{PREFIX}count/{k}": float(v) for k, v in out.items()}


def turn_summary(m: Dict[str, float]) -> str:
    """The iteration line's multi-turn part (empty without multi-turn figures)."""
    if f"{PREFIX}turns_per_row" not in m:
        return ""
    return (f" turns/row={m[f'{PREFIX}turns_per_row']:.2f} tool_calls/row={m[f'{PREFIX}tool_calls_per_row']:.2f} "
            f"tool_errors={m[f'{PREFIX}tool_errors']:.0f} tool_timeouts={m[f'{PREFIX}tool_timeouts']:.0f} "
            f"engine_idle_on_tools={m[f'{PREFIX}engine_tool_wait_seconds']:.2f}s"
            + (f" busy_while_tools={m[f'{PREFIX}engine_busy_while_tools']:.0%}"
               if f"{PREFIX}engine_busy_while_tools" in m else ""))


def turn_metrics(results: List[Dict[str, float]]) -> Dict[str, float]:
    """The round's figures from every rank's counts: per-row rates, fractions, totals (nothing without counts)."""
    keys = sorted({k for r in results for k in r if k.startswith(f"{PREFIX}count/")})
    if not keys:
        return {}
    total = {k[len(f"{PREFIX}count/"):]: sum(r.get(k, 0.0) for r in results) for k in keys}
    rows = max(total.get("rows", 0.0), 1.0)
    out = {f"{PREFIX}turns_per_row": total.get("turns", 0.0) / rows,
           f"{PREFIX}tool_calls_per_row": total.get("tool_calls", 0.0) / rows,
           f"{PREFIX}tool_call_rate": total.get("rows_with_tool_calls", 0.0) / rows,
           f"{PREFIX}tool_errors": total.get("tool_errors", 0.0),
           f"{PREFIX}tool_timeouts": total.get("tool_timeouts", 0.0),
           f"{PREFIX}tool_calls_skipped": total.get("tool_skipped", 0.0),
           f"{PREFIX}tool_seconds": total.get("tool_seconds", 0.0),
           f"{PREFIX}engine_tool_wait_seconds": total.get("engine_tool_wait_seconds", 0.0),
           # free routing: the share of later turns (after a tool round) run on another engine than the turn before
           f"{PREFIX}turns_moved_fraction": total.get("turns_moved", 0.0) / max(total.get("tool_rounds", 0.0), 1.0),
           f"{PREFIX}tool_token_fraction": total.get("tool_tokens", 0.0) / max(total.get("tokens", 0.0), 1.0)}
    running = total.get("tools_running_seconds", 0.0)
    if running > 0:  # the engines' busy fraction while tools ran, and the tools' share of the engines' serve time
        out[f"{PREFIX}engine_busy_while_tools"] = total.get("engine_busy_while_tools_seconds", 0.0) / running
        out[f"{PREFIX}tool_share_of_stage"] = running / max(total.get("serve_seconds", 0.0), running)
    out.update({f"{PREFIX}{k}": v / rows for k, v in total.items() if k.startswith("ended_")})
    return out
