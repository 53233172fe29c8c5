"""Each upstream verifier name scores with its own rule: a set of probe responses on which every
name's scores differ (acc_for_ppo is math_17k_acc by design), checked on the functions the names
resolve to and through VerifierReward's worker pool."""
import os

import pytest
import torch

from mindspeed_rl.rewards import math_verifier as mv
from mindspeed_rl.rewards.rule_reward import TEXT_VERIFIERS, VerifierReward, text_verifier_path, verifier_names
from mindspeed_rl.rewards.verifier_pool import resolve

TEXT_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "..", "..", "data", "tiny_text_tokenizer")

PROBES = [  # (response, label)
    ("<think>3+4</think><answer>\\boxed{7}</answer>", "7"),               # R1 shape, right
    ("<think>3+4</think><answer>\\boxed{8}</answer>", "7"),               # R1 shape, wrong
    ("so \\boxed{7}", "7"),                                               # boxed, no tags
    ("the answer is 7", "7"),                                             # no box
    ("Step 1: add\nStep 2: done\nAnswer: 7", "7"),                        # steps, Minerva answer line
    ("<think>a</think><answer>7</answer>", "7"),                          # tags, no box
    ("<think>t</think><answer>\\boxed{\\text{}}</answer>", "\\text{}"),   # a label math-verify cannot parse
]

# what each name scores on PROBES (upstream's values: 1 / 0, 1 / -0.5 / -1, 1 / -1, ...)
EXPECTED = {
    "acc": [1.0, -0.5, 1.0, -1.0, -1.0, -1.0, 1.0],
    "format": [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0],
    "step": [0.0, 0.0, 0.0, 0.0, 2 / 3, 0.0, 0.0],
    "strict_format": [1.0, 1.0, -0.5, -0.5, -0.5, -0.5, 1.0],
    "base_acc": [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    "math_17k_acc": [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
    "acc_for_ppo": [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
    "acc_for_dapo": [-1.0, -1.0, -1.0, -1.0, 1.0, -1.0, -1.0],
    "math_verify_reward": [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    "retool_reward": [1.0, -1.0, 1.0, -1.0, -1.0, -1.0, 1.0],
    "math_acc": [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0],
}


def test_every_text_verifier_has_expected_scores():
    assert set(EXPECTED) == set(TEXT_VERIFIERS)


def test_the_probes_tell_every_name_apart():
    rows = {}
    for name, scores in EXPECTED.items():
        rows.setdefault(tuple(scores), []).append(name)
    assert sorted(rows.values(), key=len)[-1] == ["math_17k_acc", "acc_for_ppo"]
    assert all(len(names) == 1 for names in rows.values() if "acc_for_ppo" not in names)
    assert resolve(text_verifier_path("acc_for_ppo")) is resolve(text_verifier_path("math_17k_acc"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_name_resolves_to_its_scorer(name):
    path = text_verifier_path(name)
    module, function = path.split(":")
    assert module == mv.__name__ and callable(getattr(mv, function))
    scorer = resolve(path)
    assert [scorer(response, label)[0] for response, label in PROBES] == pytest.approx(EXPECTED[name])


def test_token_verifiers_and_module_paths():
    assert text_verifier_path("length_match") is None and text_verifier_path("copy_match") is None
    assert text_verifier_path("pkg.mod:fn") == "pkg.mod:fn"
    assert verifier_names() == sorted(verifier_names()) and "length_match" in verifier_names()
    with pytest.raises(ValueError, match=r"unknown verifier 'acc_for_dap' \(did you mean 'acc_for_dapo'"):
        text_verifier_path("acc_for_dap")
    with pytest.raises(ValueError, match=r"unknown verifier 'zzzz'; known: acc, acc_for_dapo"):
        text_verifier_path("zzzz")
    with pytest.raises(ValueError, match=r"unknown verifier 3;"):
        text_verifier_path(3)


def test_rule_reward_scores_each_name_with_its_scorer():
    """All names in one VerifierReward (weights 1 .. 11): last_scores holds each name's scores, computed in the
    pool from the decoded text, and the reward is their weighted sum."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TEXT_TOKENIZER)
    eos = tok.eos_token_id
    names = sorted(EXPECTED)
    weights = [float(k + 1) for k in range(len(names))]

    def ids(text):
        return torch.tensor(tok.encode(text, add_special_tokens=False), dtype=torch.long)

    # a response scores up to EOS; the label is decoded whole
    responses = [torch.cat([ids(r), torch.tensor([eos]), ids(" \\boxed{9}")]) for r, _ in PROBES]
    reward = VerifierReward(names, weights, eos_id=eos, tokenizer=tok, timeout=60.0)
    try:
        total = reward(responses, [ids(label) for _, label in PROBES])
    finally:
        reward.close()
    for name in names:
        assert reward.last_scores[name].tolist() == pytest.approx(EXPECTED[name]), name
        assert reward.last_metrics[f"reward/{name}/mean"] == pytest.approx(sum(EXPECTED[name]) / len(PROBES))
    want = [sum(w * EXPECTED[n][k] for n, w in zip(names, weights)) for k in range(len(PROBES))]
    assert total.tolist() == pytest.approx(want)
