"""Shared inputs of the engine equivalence tests: a fixed batch and a loss linear in the log-probs."""
import torch


def engine_data(n: int):
    """``n`` short random prompts and responses (token ids 4..31), the same on every call."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 32, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g) for _ in range(n)]
    responses = [torch.randint(4, 32, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g) for _ in range(n)]
    return prompts, responses


def linear_loss_fn(mine):
    """Loss with a per-row weight from ``mine``: the engine's gradient is then easy to compare across layouts."""
    def loss_fn(indexes, log_probs, entropies):
        total = torch.zeros(())
        for i, lp in zip(indexes, log_probs):
            total = total + (-(0.6 - 0.15 * mine[i]) * lp).sum()
        return total, {"actor/loss_sum": float(total.detach())}
    return loss_fn
