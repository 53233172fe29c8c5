"""A tool's answer cut to ``max_length`` characters. The side names are upstream's; each says what is KEPT:

- 'left':   keeps the first ``max_length`` characters, then ``...(truncated)``
- 'right':  ``(truncated)...``, then the last ``max_length`` characters
- 'middle': the first and the last ``max_length // 2`` characters around ``...(truncated)...``

``max_length`` 0 or None means no limit. (Upstream's 'middle' with 0 returned the marker plus the whole
text, a slicing accident; here 0 is simply "no limit".) An unknown side raises ValueError; config checks use
``TRUNCATE_SIDES``."""
from typing import Optional

TRUNCATE_SIDES = ("left", "right", "middle")


def truncate_tool_response(text: str, max_length: Optional[int], side: str = "middle") -> str:
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"tool_response_truncate_side must be one of {', '.join(TRUNCATE_SIDES)}, got {side!r}")
    if max_length is not None and max_length < 0:
        raise ValueError(f"max_tool_response_length must be >= 0 (0: no limit), got {max_length}")
    if not max_length or len(text) <= max_length:
        return text
    if side == "left":
        return text[:max_length] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[len(text) - max_length:]
    half = max_length // 2
    return text[:half] + "...(truncated)..." + text[len(text) - half:]
