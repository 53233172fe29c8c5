"""Text verifiers: upstream MindSpeed-RL's rule-verifier names, scored on math-verify.

Every verifier takes ``(response, label)`` (decoded text) and returns
``(score, outcome)``; the outcome is counted in the reward metrics. The names
and score values follow upstream's ``models/rule_verifier.py`` (05a90d7):

=====================  =====================================================  ==================
name                   what is checked                                        scores
=====================  =====================================================  ==================
``base_acc``           R1 shape (think, answer, boxed) and the last boxed      1 / 0
                       answer equal to the label
``math_17k_acc``       the last boxed answer equal to the label                1 / 0
``acc_for_ppo``        same as ``math_17k_acc``                                1 / 0
``math_verify_reward`` R1 shape, then math-verify on the whole response        1 / 0
                       against ``\\boxed{label}``
``acc``                upstream's math-toolkit answer (boxed, "the answer      1 / -0.5 / -1
                       is", last number); right, wrong, or no boxed answer
``acc_for_dapo``       DAPO's Minerva check: the last "Answer: ..." line of    1 / -1
                       the last 300 characters, normalised, equals the label
``retool_reward``      the last boxed answer in the last 100 characters is     1 / -1
                       exactly the label
``format``             ``<think>...</think> <answer>...</answer>``             1 / 0
``strict_format``      one of each tag and one boxed answer, in order,         1 / -0.5
                       starting with <think>, ending with </answer>
``step``               step markers ("Step 1:", "First,", bullets), n / 3      0 .. 1
``math_acc``           ours: the last boxed answer, else the last "the         1 / 0
                       answer is ...", else a bare one-token response; no
                       format needed
=====================  =====================================================  ==================

Where upstream grades equality with mathruler or its math toolkit, we use
math-verify (``check_answer``): both sides are parsed and compared
symbolically; when either side does not parse, normalised strings decide and
the outcome says ``fallback``. math-verify's own timers are off: the verifier
pool times each response (``verifier_pool.py``).
"""
import logging
import re
from typing import Optional, Tuple

Score = Tuple[float, str]

# R1 shape used by base_acc and math_verify_reward (whole response)
_R1_BOXED = re.compile(r"<think>.*</think>.*<answer>.*\\boxed\{.*\}.*</answer>", re.DOTALL)
# upstream's `format`: matched from the start; `$` may sit before any newline (MULTILINE)
_R1_TAGS = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.DOTALL | re.MULTILINE)
_STEPS = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)")
_ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*(.+?)\s*(?:\.\s*$|\.\s+|$)", re.IGNORECASE | re.DOTALL)
_MINERVA_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")


# ---------------------------------------------------------------- extraction

def _balanced(text: str, brace: int) -> Optional[int]:
    """Index of the brace closing the one at ``brace``, or None."""
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed(text: str) -> Optional[str]:
    """Content of the last \\boxed{...} (braces balanced, spaces before '{' allowed), or None."""
    start = text.rfind("\\boxed")
    while start != -1:
        brace = text.find("{", start)
        if brace != -1 and text[start + len("\\boxed"):brace].strip() == "":
            end = _balanced(text, brace)
            if end is not None:
                return text[brace + 1:end].strip()
        start = text.rfind("\\boxed", 0, start)
    return None


def final_answer(text: str) -> Optional[str]:
    """``math_acc``'s answer: the last \\boxed{...}; else what follows the LAST
    "the answer is" (up to a full stop); else the whole response when it is one
    bare token (e.g. "456"); else None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    hits = _ANSWER_IS.findall(text)
    if hits:
        return hits[-1].strip().strip("$").strip()
    bare = text.strip()
    return bare if bare and not any(c.isspace() for c in bare) else None


def toolkit_answer(text: str) -> str:
    """``acc``'s answer, in upstream's math-toolkit order: a Minerva "final
    answer is $...$. I hope", else the last "boxed" (balanced braces, or up to
    '$'), else all after the LAST "the answer is", else after the last "final
    answer is", else after the first "答案是" (first paragraph), else the last
    number. Newlines are dropped, a leading ':' and a trailing '.' or '/' cut.
    "" when nothing is found."""
    if "final answer is $" in text and "$. I hope" in text:
        pred = text.split("final answer is $", 1)[1].split("$. I hope", 1)[0].strip()
    elif "boxed" in text:
        tail = text.split("boxed")[-1]
        if not tail:
            return ""
        if tail[0] == "{":
            end = _balanced(tail, 0)
            pred = tail[1:end] if end is not None else tail[1:]
        else:
            pred = tail.split("$")[0].strip()
    elif "he answer is" in text:
        pred = text.split("he answer is")[-1].strip()
    elif "final answer is" in text:
        pred = text.split("final answer is")[-1].strip()
    elif "答案是" in text:
        pred = text.split("答案是")[1].strip().split("\n\n")[0].strip()
    else:
        numbers = re.findall(r"-?\d*\.?\d+", text.replace(",", ""))
        pred = numbers[-1] if numbers else ""
    pred = re.sub(r"\n\s*", "", pred)
    if pred.startswith(":"):
        pred = pred[1:]
    if pred.endswith(".") or pred.endswith("/"):
        pred = pred[:-1]
    return pred.strip()


# ---------------------------------------------------------------- equality

def _normalise(text: str) -> str:
    text = re.sub(r"\\text\{([^}]*)\}", r"\1", text)
    return re.sub(r"[\s$]", "", text).rstrip(".").lower()


def _parse(text: str, config=None):
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its own timer is off: the pool times us
    from math_verify import parse
    if config is None:
        return parse(text if "$" in text else f"${text}$", parsing_timeout=None)
    return parse(text, extraction_config=config, parsing_timeout=None)


def check_answer(answer: str, label: str) -> Score:
    """(1.0 or 0.0, how it was decided: 'math_verify' or 'fallback')."""
    from math_verify import verify
    gold, pred = _parse(label), _parse(answer)
    if gold and pred:
        return float(verify(gold, pred, timeout_seconds=None)), "math_verify"
    return float(_normalise(answer) == _normalise(label)), "fallback"


def warm_up() -> None:
    """Import math-verify and sympy and check one answer (the pool calls this
    before it times anything, so a cold process is not charged for imports)."""
    check_answer("\\frac{1}{2}", "0.5")
    _math_verify_score("\\boxed{1}", "1")


# ---------------------------------------------------------------- accuracy verifiers

def math_acc(response: str, label: str) -> Score:
    """Ours (no format needed): outcome 'math_verify', 'fallback' or 'no_answer'."""
    answer = final_answer(response)
    if not answer:
        return 0.0, "no_answer"
    return check_answer(answer, label)


def math_17k_acc(response: str, label: str) -> Score:
    """The last boxed answer equals the label: 1, else 0."""
    answer = last_boxed(response)
    if not answer:
        return 0.0, "no_answer"
    return check_answer(answer, label)


acc_for_ppo = math_17k_acc


def base_acc(response: str, label: str) -> Score:
    """R1 shape (think, answer tags, a boxed answer inside) and the last boxed answer right: 1, else 0."""
    if not _R1_BOXED.fullmatch(response):
        return 0.0, "no_format"
    return math_17k_acc(response, label)


def _math_verify_score(response: str, label: str) -> Score:
    from math_verify import verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig
    gold = _parse("\\boxed{" + label + "}", [LatexExtractionConfig()])
    if not gold:
        return 0.0, "bad_label"
    pred = _parse(response, [ExprExtractionConfig(), LatexExtractionConfig()])
    if not pred:
        return 0.0, "no_answer"
    return float(verify(gold, pred, float_rounding=6, timeout_seconds=None)), "math_verify"


def math_verify_reward(response: str, label: str) -> Score:
    """R1 shape, then math-verify over the whole response against \\boxed{label}: 1, else 0."""
    if not _R1_BOXED.fullmatch(response):
        return 0.0, "no_format"
    return _math_verify_score(response, label)


def acc(response: str, label: str) -> Score:
    """1 right, -0.5 wrong, -1 when there is no answer or no boxed answer (upstream's ``acc``)."""
    text = re.sub(r"^.*?<\|im_start\|>assistant", "<|im_start|>assistant", response, count=1, flags=re.DOTALL)
    for stop in ("</s>", "<|im_end|>", "<|endoftext|>"):
        if stop in text:
            text = text.split(stop)[0].strip()
    answer = toolkit_answer(text)
    if not answer:
        return -1.0, "no_answer"
    if "boxed" not in text:
        return -1.0, "no_boxed"
    right, how = check_answer(answer, label)
    return (1.0 if right else -0.5), how


# DAPO's Minerva normalisation: replacements, then unit words dropped
_MINERVA_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""),
                    ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_MINERVA_DROP = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
    r",\!", "{,}", '"', "\\dots")


def minerva_normalise(answer: str) -> str:
    """DAPO's normal form of a final answer (right of the last '=', units and TeX wrappers dropped)."""
    text = answer.split("=")[-1]
    for old, new in _MINERVA_REPLACE:
        text = text.replace(old, new)
    for word in _MINERVA_DROP:
        text = text.replace(word, "")
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", text)
    for wrapper in ("text", "textbf", "overline"):
        text = re.sub(r"(\\" + wrapper + r"\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", text)
    text = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text)   # \fracab -> \frac{a}{b}
    text = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", text)           # \sqrta -> \sqrt{a}
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def acc_for_dapo(response: str, label: str) -> Score:
    """1 when the last "Answer: ..." of the last 300 characters equals the label after
    Minerva normalisation, else -1 (also when there is none)."""
    hits = _MINERVA_ANSWER.findall(response[-300:])
    if not hits:
        return -1.0, "no_answer"
    return (1.0, "match") if minerva_normalise(hits[-1]) == minerva_normalise(label) else (-1.0, "no_match")


def _last_boxed_exact(text: str) -> Optional[str]:
    """Content of the last literal "\\boxed{" with balanced braces, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    end = _balanced(text, start + len("\\boxed"))
    return text[start + len("\\boxed{"):end] if end is not None else None


def retool_reward(response: str, label: str) -> Score:
    """1 when the last boxed answer in the last 100 characters is exactly the label, else -1 (with multi-turn
    rollouts the reward stage adds upstream's tool-call bonus: ``retool_tool_bonus``)."""
    answer = _last_boxed_exact(response[-100:])
    if answer is None:
        return -1.0, "no_answer"
    return (1.0, "match") if answer == label else (-1.0, "no_match")


def retool_tool_bonus(score: float, tool_calls: int) -> float:
    """Upstream's retool_reward for a wrong answer: 0.1 more per tool round, at most 0; a right one keeps 1."""
    return min(0.0, score + 0.1 * int(tool_calls)) if score < 0 else score


# ---------------------------------------------------------------- format verifiers

def format_reward(response: str, label: str = "") -> Score:
    """1 for ``<think>...</think>`` then ``<answer>...</answer>`` (upstream's ``format``), else 0."""
    return (1.0, "match") if _R1_TAGS.match(response) else (0.0, "no_match")


def strict_format(response: str, label: str = "") -> Score:
    """1 when each of <think>, </think>, <answer>, </answer> and one \\boxed{...} occur once,
    in that order, the response starts with <think> and ends with </answer>; else -0.5."""
    tags = ("<think>", "</think>", "<answer>")
    counts = [response.count(t) for t in tags] + [len(re.findall(r"\\boxed\{.*?\}", response)),
                                                  response.count("</answer>")]
    if counts != [1] * 5 or not response.startswith("<think>") or not response.endswith("</answer>"):
        return -0.5, "no_match"
    positions = [response.find(t) for t in tags] + [re.search(r"\\boxed\{.*?\}", response).start(),
                                                    response.find("</answer>")]
    return (1.0, "match") if positions == sorted(positions) else (-0.5, "no_match")


def reasoning_steps(response: str, label: str = "") -> Score:
    """min(1, markers / 3) for step markers ("Step 1:", "1." at the start, bullets, "First,", ...)."""
    return min(1.0, len(_STEPS.findall(response)) / 3), "ok"
