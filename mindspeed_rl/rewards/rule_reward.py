"""Rule-based rewards: named verifiers (token or text) and their weighted sum."""
import difflib
from typing import Callable, Dict, List, Optional

import torch

from mindspeed_rl.rewards.math_verifier import retool_tool_bonus
from mindspeed_rl.models.tiny_model import MAX_TOY_LENGTH, TOOL_CALL_ID, TOOL_CLOSE_ID
from mindspeed_rl.rewards.verifier_pool import VerifierPool, resolve


def _tokens(t: torch.Tensor) -> List[int]:
    return [int(x) for x in t.reshape(-1).tolist()]


def _before_eos(response: torch.Tensor, eos_id: int) -> List[int]:
    """Response tokens before the first EOS (all of them if there is none)."""
    toks = _tokens(response)
    return toks[:toks.index(eos_id)] if eos_id in toks else toks


def length_match(response: torch.Tensor, label: torch.Tensor, eos_id: int) -> float:
    """max(0, 1 - |len - L| / 8), len = tokens before the first EOS, L = label[0]."""
    target = _tokens(label)[0]
    length = len(_before_eos(response, eos_id))
    return max(0.0, 1.0 - abs(length - target) / MAX_TOY_LENGTH)


def copy_match(response: torch.Tensor, label: torch.Tensor, eos_id: int) -> float:
    """Fraction of label positions that the response repeats at the same position.

    Only tokens before the first EOS count, so nothing after the end of the answer scores.
    """
    want = _tokens(label)
    if not want:
        return 0.0
    got = _before_eos(response, eos_id)[:len(want)]
    return sum(int(a == b) for a, b in zip(got, want)) / len(want)


def tool_match(response: torch.Tensor, label: torch.Tensor, eos_id: int) -> float:
    """The toy tool task: 1 when the answer (the first token after the last tool answer, else the first token)
    is the label's digit; else 0.1 when the row called the tool (upstream retool_reward's nudge), else 0."""
    ids = _tokens(response)
    after = max((i + 1 for i, t in enumerate(ids) if t == TOOL_CLOSE_ID), default=0)
    if after < len(ids) and ids[after] == _tokens(label)[0]:
        return 1.0
    return 0.1 if TOOL_CALL_ID in ids else 0.0


# token verifiers (toy tasks): (response ids, label ids, eos id) -> score, run inline
VERIFIERS: Dict[str, Callable[[torch.Tensor, torch.Tensor, int], float]] = {
    "length_match": length_match,
    "copy_match": copy_match,
    "tool_match": tool_match,
}
# text verifiers: decoded response and label, run in worker processes under verifier_timeout.
# The names are upstream MindSpeed-RL's (models/rule_verifier.py); see math_verifier.py for what each scores.
_MV = "mindspeed_rl.rewards.math_verifier"
TEXT_VERIFIERS = {
    "acc": f"{_MV}:acc",
    "format": f"{_MV}:format_reward",
    "step": f"{_MV}:reasoning_steps",
    "strict_format": f"{_MV}:strict_format",
    "base_acc": f"{_MV}:base_acc",
    "math_17k_acc": f"{_MV}:math_17k_acc",
    "acc_for_dapo": f"{_MV}:acc_for_dapo",
    "acc_for_ppo": f"{_MV}:acc_for_ppo",
    "math_verify_reward": f"{_MV}:math_verify_reward",
    "retool_reward": f"{_MV}:retool_reward",
    "math_acc": f"{_MV}:math_acc",  # ours: any final answer, no format needed
}


def verifier_names() -> List[str]:
    """Every registered verifier name (token and text), sorted; besides these, any 'module:function'."""
    return sorted(set(VERIFIERS) | set(TEXT_VERIFIERS))


def text_verifier_path(name: str) -> Optional[str]:
    """The 'module:function' a verifier name scores with (None for a token verifier); an unknown
    name is a ValueError naming the closest known ones (the one check of verifier names)."""
    if name in VERIFIERS:
        return None
    path = TEXT_VERIFIERS.get(name, name if isinstance(name, str) and ":" in name else None)
    if path is None:
        close = difflib.get_close_matches(str(name), verifier_names(), n=3)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise ValueError(f"unknown verifier {name!r}{hint}; known: {', '.join(verifier_names())}, "
                         f"or 'module:function'")
    return path


class VerifierReward:
    """Scores responses by a weighted sum of named verifiers.

    Token verifiers (``length_match``, ``copy_match``) read token ids. Text
    verifiers (upstream's names, see ``verifier_names()``, or any
    ``module:function``) read the decoded response (up to EOS) and label, in
    ``parallel`` worker processes with ``timeout`` seconds per response. The
    reward is sum(weight_i * score_i) (upstream's ``verifier_weight``).
    ``last_metrics``: ``reward/<name>/mean``, ``reward/<name>/timeouts`` and
    ``reward/<name>/errors`` (text verifiers), and a count per other outcome.
    ``last_failures``: per text verifier, the rows it scored, how many raised or timed
    out, and the first error as raised (trainer/utils/reward_guard.py reads it).
    """

    def __init__(self, verifier_function: List[str], verifier_weight: List[float], eos_id: int,
                 tokenizer=None, parallel: int = 1, timeout: float = 30.0):
        if len(verifier_function) != len(verifier_weight):
            raise ValueError(
                f"verifier_function has {len(verifier_function)} entries but "
                f"verifier_weight has {len(verifier_weight)}")
        self.paths = {}
        for name in verifier_function:
            path = text_verifier_path(name)
            if path is None:
                continue
            resolve(path)  # fail now, naming it, not in a worker
            self.paths[name] = path
        if self.paths and tokenizer is None:
            raise ValueError(f"text verifiers {sorted(self.paths)} need the tokenizer to decode responses")
        self.verifier_function = list(verifier_function)
        self.verifier_weight = [float(w) for w in verifier_weight]
        self.eos_id = int(eos_id)
        self.tokenizer = tokenizer
        self.pool = VerifierPool(parallel, timeout, warm=sorted(set(self.paths.values()))) if self.paths else None
        self.last_metrics: Dict[str, float] = {}

    takes_tool_calls = True  # the reward stage passes multi-turn rows' tool rounds (tool_call_nums)

    def _text(self, ids: torch.Tensor, stop_at_eos: bool) -> str:
        toks = _before_eos(ids, self.eos_id) if stop_at_eos else _tokens(ids)
        return self.tokenizer.decode(toks, skip_special_tokens=True)

    def __call__(self, responses: List[torch.Tensor], labels: List[torch.Tensor],
                 tool_call_nums: Optional[List[int]] = None) -> torch.Tensor:
        """``tool_call_nums``: multi-turn rows (their turns end at EOS, so the whole response is read: every turn
        and tool answer, as upstream decodes it) and their tool rounds (retool_reward's bonus)."""
        if len(responses) != len(labels):
            raise ValueError(f"got {len(responses)} responses but {len(labels)} labels")
        multi_turn = tool_call_nums is not None
        if multi_turn and len(tool_call_nums) != len(responses):
            raise ValueError(f"got {len(tool_call_nums)} tool_call_nums for {len(responses)} responses")
        total = torch.zeros(len(responses), dtype=torch.float32)
        metrics = {}
        texts = None
        self.last_scores: Dict[str, torch.Tensor] = {}  # each verifier's own scores (DAPO's filter metric)
        self.last_failures: Dict[str, dict] = {}  # text verifiers: rows that raised or timed out, first error
        for name, weight in zip(self.verifier_function, self.verifier_weight):
            if name in VERIFIERS:
                scores = [VERIFIERS[name](r, l, self.eos_id) for r, l in zip(responses, labels)]
            else:
                if texts is None:
                    texts = ([self._text(r, not multi_turn) for r in responses],
                             [self._text(l, False) for l in labels])
                scores, outcomes = self.pool.score(self.paths[name], *texts)
                outcomes = dict(outcomes)
                # stable keys for the console: timeouts and errors are always there
                metrics[f"reward/{name}/timeouts"] = float(outcomes.pop("timeout", 0))
                metrics[f"reward/{name}/errors"] = float(outcomes.pop("error", 0))
                self.last_failures[name] = {"rows": len(responses), "weight": weight,
                                            "errors": int(metrics[f"reward/{name}/errors"]),
                                            "timeouts": int(metrics[f"reward/{name}/timeouts"]),
                                            "first_error": self.pool.first_error}
                metrics.update({f"reward/{name}/{k}": float(v) for k, v in outcomes.items()})
            if multi_turn and name == "retool_reward":
                scores = [retool_tool_bonus(x, n) for x, n in zip(scores, tool_call_nums)]
            scores = torch.tensor(scores, dtype=torch.float32)
            metrics[f"reward/{name}/mean"] = float(scores.mean()) if len(scores) else 0.0
            self.last_scores[name] = scores
            total += weight * scores
        self.last_metrics = metrics
        return total

    def close(self):
        if self.pool is not None:
            self.pool.close()
