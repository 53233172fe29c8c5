"""VerifierReward.last_failures (what reward_guard reads: rows, weight, errors, timeouts, the first error
as raised), integer scores from a custom verifier, and the pool defaults, without worker processes."""
import pytest
import torch

from mindspeed_rl.rewards import rule_reward as rr
from mindspeed_rl.rewards.rule_reward import VerifierReward

EOS = 13


class Tokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids)


class Pool:
    """Stands in for VerifierPool: fixed scores and outcomes per path, and a first error."""

    def __init__(self, results, first_error=None):
        self.results, self.first_error = results, first_error

    def score(self, path, responses, labels):
        return self.results[path]

    def close(self):
        pass


def _reward(names, weights, results, first_error=None):
    reward = VerifierReward(names, weights, eos_id=EOS, tokenizer=Tokenizer())
    reward.pool = Pool(results, first_error)
    return reward


def test_last_failures_per_text_verifier():
    acc, fmt = rr.TEXT_VERIFIERS["acc"], rr.TEXT_VERIFIERS["format"]
    boom = ValueError("bad answer")
    reward = _reward(["length_match", "acc", "format"], [1.0, 2.0, 0.5],
                     {acc: ([1.0, 0.0, 0.0], {"math_verify": 1, "error": 1, "timeout": 1}),
                      fmt: ([1.0, 1.0, 0.0], {"match": 2, "no_match": 1})}, first_error=boom)
    rows = [torch.tensor([1, EOS])] * 3
    reward(rows, rows)
    assert set(reward.last_failures) == {"acc", "format"}  # token verifiers have none
    assert reward.last_failures["acc"] == {"rows": 3, "weight": 2.0, "errors": 1, "timeouts": 1, "first_error": boom}
    assert reward.last_failures["format"] == {"rows": 3, "weight": 0.5, "errors": 0, "timeouts": 0,
                                              "first_error": boom}


def test_integer_scores_are_taken_as_floats():
    path = "my_pkg.verifiers:score"
    reward = VerifierReward(["length_match"], [1.0], eos_id=EOS)  # built without resolving the custom path
    reward.verifier_function, reward.verifier_weight = [path], [3.0]
    reward.paths, reward.tokenizer, reward.pool = {path: path}, Tokenizer(), Pool({path: ([1, 0], {})})
    out = reward([torch.tensor([1])] * 2, [torch.tensor([1])] * 2)
    assert out.dtype == torch.float32 and out.tolist() == [3.0, 0.0]
    assert reward.last_scores[path].dtype == torch.float32
    assert reward.last_metrics[f"reward/{path}/mean"] == pytest.approx(0.5)


def test_defaults_one_process_thirty_seconds_no_metrics_yet():
    reward = VerifierReward(["acc"], [1.0], eos_id=EOS, tokenizer=Tokenizer())
    assert (reward.pool.processes, reward.pool.timeout) == (1, 30.0)  # upstream's verifier defaults
    assert reward.last_metrics == {}
    reward.close()
