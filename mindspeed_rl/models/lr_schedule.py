"""Learning-rate schedules (upstream's lr_decay_style / min_lr / lr_warmup_fraction)."""
import math

STYLES = ("constant", "linear", "cosine")


def lr_at(step: int, base_lr: float, min_lr: float = 0.0, total_steps: int = 1,
          warmup_steps: int = 0, style: str = "constant") -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warm-up from 0,
    then constant, or a linear / cosine decay from ``base_lr`` to ``min_lr``."""
    if style not in STYLES:
        raise ValueError(f"lr_decay_style must be one of {STYLES}, got {style!r}")
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if style == "constant":
        return base_lr
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, max(0.0, (step - warmup_steps) / span))
    if style == "linear":
        return min_lr + (base_lr - min_lr) * (1.0 - progress)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
