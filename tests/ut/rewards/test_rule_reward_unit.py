"""VerifierReward without worker processes: what it hands the verifier pool (responses cut at EOS, labels
whole, decoded once), how it weighs and reports the scores, and how it checks its arguments."""
import pytest
import torch

from mindspeed_rl.rewards import rule_reward as rr
from mindspeed_rl.rewards.rule_reward import VerifierReward

EOS = 13


def t(*xs):
    return torch.tensor(xs, dtype=torch.long)


class Tokenizer:
    """Decodes ids as space-separated numbers and counts the calls."""

    def __init__(self):
        self.calls = []

    def decode(self, ids, skip_special_tokens=False):
        self.calls.append((list(ids), skip_special_tokens))
        return " ".join(str(i) for i in ids)


class Pool:
    """Stands in for VerifierPool: fixed scores and outcomes per path."""

    def __init__(self, results):
        self.results, self.seen, self.closed = results, [], False
        self.first_error = None

    def score(self, path, responses, labels):
        self.seen.append((path, list(responses), list(labels)))
        return self.results[path]

    def close(self):
        self.closed = True


def _reward(names, weights, results, tokenizer=None):
    reward = VerifierReward(names, weights, eos_id=EOS, tokenizer=tokenizer or Tokenizer())
    reward.pool = Pool(results)
    return reward


def test_text_verifiers_get_responses_up_to_eos_and_whole_labels_decoded_once():
    tok = Tokenizer()
    paths = {"acc": rr.TEXT_VERIFIERS["acc"], "format": rr.TEXT_VERIFIERS["format"]}
    reward = _reward(["acc", "format"], [1.0, 1.0], {paths["acc"]: ([1.0, 0.0], {"math_verify": 2}),
                                                     paths["format"]: ([0.0, 1.0], {"match": 1, "no_match": 1})}, tok)
    reward([t(1, 2, EOS, 4), t(5, 6)], [t(7, EOS, 8), t(9)])
    texts = (["1 2", "5 6"], [f"7 {EOS} 8", "9"])
    assert reward.pool.seen == [(paths["acc"], *texts), (paths["format"], *texts)]
    assert len(tok.calls) == 4 and all(skip for _, skip in tok.calls)  # 2 responses + 2 labels, once


def test_weights_scores_and_metrics():
    path = rr.TEXT_VERIFIERS["acc"]
    reward = _reward(["copy_match", "acc"], [0.5, 2], {path: ([1.0, -0.5], {"math_verify": 1, "timeout": 1,
                                                                            "no_boxed": 3})})
    out = reward([t(4, 5, EOS), t(9, 9)], [t(4, 5), t(4, 5)])
    assert out.tolist() == pytest.approx([0.5 * 1.0 + 2 * 1.0, 0.5 * 0.0 + 2 * -0.5])
    assert reward.verifier_weight == [0.5, 2.0] and all(type(w) is float for w in reward.verifier_weight)
    assert set(reward.last_scores) == {"copy_match", "acc"}
    assert reward.last_scores["acc"].tolist() == [1.0, -0.5] and reward.last_scores["acc"].dtype == torch.float32
    assert reward.last_metrics == {
        "reward/copy_match/mean": 0.5, "reward/acc/mean": 0.25, "reward/acc/timeouts": 1.0,
        "reward/acc/errors": 0.0, "reward/acc/math_verify": 1.0, "reward/acc/no_boxed": 3.0}


def test_errors_are_counted_under_errors():
    path = rr.TEXT_VERIFIERS["step"]
    reward = _reward(["step"], [1.0], {path: ([0.0], {"error": 1})})
    reward([t(1)], [t(1)])
    assert reward.last_metrics == {"reward/step/timeouts": 0.0, "reward/step/errors": 1.0, "reward/step/mean": 0.0}


def test_metrics_are_those_of_the_last_call():
    reward = VerifierReward(["length_match"], [1.0], eos_id=EOS)
    reward([t(1, EOS)], [t(1)])
    assert reward.last_metrics == {"reward/length_match/mean": 1.0}
    out = reward([], [])
    assert out.shape == (0,) and reward.last_metrics == {"reward/length_match/mean": 0.0}


def test_a_verifier_named_twice_counts_twice():
    reward = VerifierReward(["length_match", "length_match"], [1.0, 0.5], eos_id=EOS)
    assert reward([t(1, EOS)], [t(1)]).tolist() == [1.5]


def test_pool_settings_and_close():
    reward = VerifierReward(["acc", "base_acc", "acc"], [1, 1, 1], eos_id=EOS, tokenizer=Tokenizer(), parallel=3,
                        timeout=7.5)
    assert reward.paths == {"acc": rr.TEXT_VERIFIERS["acc"], "base_acc": rr.TEXT_VERIFIERS["base_acc"]}
    assert (reward.pool.processes, reward.pool.timeout) == (3, 7.5)
    assert reward.pool.warm == tuple(sorted({rr.TEXT_VERIFIERS["acc"], rr.TEXT_VERIFIERS["base_acc"]}))
    assert reward.eos_id == EOS and type(reward.eos_id) is int
    pool = Pool({})
    reward.pool = pool
    reward.close()
    assert pool.closed
    token_only = VerifierReward(["copy_match"], [1.0], eos_id=EOS)
    assert token_only.pool is None and token_only.paths == {}
    token_only.close()


def test_argument_errors_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"^verifier_function has 2 entries but verifier_weight has 1$"):
        VerifierReward(["length_match", "copy_match"], [1.0], eos_id=EOS)
    with pytest.raises(ValueError, match=r"^text verifiers \['acc', 'format'\] need the tokenizer to decode "
                                         r"responses$"):
        VerifierReward(["format", "length_match", "acc"], [1, 1, 1], eos_id=EOS)
    reward = VerifierReward(["copy_match"], [1.0], eos_id=EOS)
    with pytest.raises(ValueError, match=r"^got 1 responses but 2 labels$"):
        reward([t(1)], [t(1), t(2)])


def test_an_unimportable_module_path_fails_at_construction():
    with pytest.raises(ValueError, match="no.such.module"):
        VerifierReward(["no.such.module:f"], [1.0], eos_id=EOS, tokenizer=Tokenizer())


@pytest.mark.parametrize("response, target, score", [
    (t(1, 2, 3, EOS), 3, 1.0),
    (t(EOS, 1, 2, 3), 3, 1.0 - 3 / 8),
    (t(1, 2), 10, 1.0 - 8 / 8),
    (t(1, 2), 3, 1.0 - 1 / 8),
])
def test_length_match_counts_tokens_before_the_first_eos(response, target, score):
    assert rr.length_match(response, t(target), EOS) == pytest.approx(score)


def test_copy_match_with_an_empty_label_scores_zero():
    assert rr.copy_match(t(1, 2), t(), EOS) == 0.0
    assert rr.copy_match(t(1, 2).reshape(1, 2), t(1, 2).reshape(2, 1), EOS) == 1.0  # any shape: flattened
