"""Hand-made batches for the algorithm reference checks: 2 groups of 3 rows, right-padded to 4 tokens."""
import math

import pytest
import torch

LENGTHS = [4, 2, 3, 1, 4, 2]
SCORES = [1.0, 0.0, 0.5, 2.0, -1.0, 0.0]
N = 3


def mask_of(lengths, width=4):
    return torch.tensor([[t < n for t in range(width)] for n in lengths])


def outcome_rewards(scores=SCORES, lengths=LENGTHS, width=4):
    """Each row's score on its last response token (as the advantage stage builds them)."""
    r = torch.zeros(len(scores), width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        r[i, n - 1] = s
    return r


def py_mean(xs):
    return sum(xs) / len(xs)


def py_std(xs):  # unbiased
    m = py_mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def py_whiten(values, lengths):
    """Whiten every masked value of a list of rows with their (unbiased) mean and variance; eps 1e-8."""
    flat = [v for row, n in zip(values, lengths) for v in row[:n]]
    m, var = py_mean(flat), py_std(flat) ** 2
    return [[(v - m) / math.sqrt(var + 1e-8) if t < n else 0.0 for t, v in enumerate(row)]
            for row, n in zip(values, lengths)]


@pytest.fixture
def batch():
    return outcome_rewards(), mask_of(LENGTHS)
