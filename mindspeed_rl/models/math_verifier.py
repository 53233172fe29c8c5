"""Text verifiers for real data: answer accuracy with math-verify, and the R1 format.

``base_acc(response, label)`` takes the response's final answer - the last
``\\boxed{...}``, else the text after the last "the answer is", else a bare
one-token response - and checks it
is mathematically equal to the label with math-verify (HF's verifier). When
either side cannot be parsed, an exact match of the normalised strings
decides, and the result says so. No answer scores 0.
"""
import logging
import re
from typing import Optional, Tuple

_ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*(.+?)\s*(?:\.\s*$|\.\s+|$)", re.IGNORECASE | re.DOTALL)
_FORMAT = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?\\boxed\{.*\}.*?</answer>\s*", re.DOTALL)


def last_boxed(text: str) -> Optional[str]:
    """Content of the last \\boxed{...} (braces balanced), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        brace = text.find("{", start)
        if brace != -1 and text[start + len("\\boxed"):brace].strip() == "":
            depth = 0
            for i in range(brace, len(text)):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    return text[brace + 1:i].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


def final_answer(text: str) -> Optional[str]:
    """The last \\boxed{...}; else what follows the last "the answer is"; else
    the whole response when it is one bare token (e.g. "456"); else None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    hits = _ANSWER_IS.findall(text)
    if hits:
        return hits[-1].strip().strip("$").strip()
    bare = text.strip()
    return bare if bare and not any(c.isspace() for c in bare) else None


def _normalise(text: str) -> str:
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    return re.sub(r"[\s$]", "", text).rstrip(".").lower()


def _parse(text: str):
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its own timer is off: the pool times us
    from math_verify import parse
    return parse(text if "$" in text else f"${text}$", parsing_timeout=None)


def check_answer(answer: str, label: str) -> Tuple[float, str]:
    """(1.0 or 0.0, how it was decided: 'math_verify' or 'fallback')."""
    from math_verify import verify
    gold, pred = _parse(label), _parse(answer)
    if gold and pred:
        return float(verify(gold, pred, timeout_seconds=None)), "math_verify"
    return float(_normalise(answer) == _normalise(label)), "fallback"


def base_acc(response: str, label: str) -> Tuple[float, str]:
    """(score, outcome): outcome is 'math_verify', 'fallback' or 'no_answer'."""
    answer = final_answer(response)
    if answer is None or answer == "":
        return 0.0, "no_answer"
    return check_answer(answer, label)


def format_reward(response: str, label: str = "") -> Tuple[float, str]:
    """1.0 for the R1 shape: <think>...</think> then <answer>...\\boxed{...}...</answer>."""
    return (1.0, "match") if _FORMAT.fullmatch(response) else (0.0, "no_match")
