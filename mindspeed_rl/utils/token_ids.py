"""The dtype token ids travel in: int32 from the dataset and the rollout through the dock and Ray to
the ranks; the engine widens them to long on the device (``.to(device, torch.long)``, one op)."""
import torch

TOKEN_DTYPE = torch.int32


def token_ids(ids) -> torch.Tensor:
    """A 1-D tensor of token ids (a list or a tensor) in ``TOKEN_DTYPE``."""
    return torch.as_tensor(ids).reshape(-1).to(TOKEN_DTYPE)
