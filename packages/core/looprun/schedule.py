"""Learning-rate schedules: linear warm-up, then cosine decay or constant."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def lr_factor(
    step: int, warmup_steps: int, total_steps: int, schedule: str = "cosine", final_ratio: float = 0.0
) -> float:
    """Multiplier of the base LR at optimizer step ``step`` (0-based).

    Warm-up rises linearly from ``1 / warmup_steps`` to 1; ``cosine`` then decays to ``final_ratio``
    at ``total_steps``; ``constant`` stays at 1.
    """
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"unknown LR schedule {schedule!r}; choose cosine or constant")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(
    optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, schedule: str = "cosine",
    final_ratio: float = 0.0,
) -> LambdaLR:
    """A ``LambdaLR`` implementing :func:`lr_factor` (its ``state_dict`` resumes exactly)."""
    lr_factor(0, warmup_steps, total_steps, schedule, final_ratio)  # validate eagerly
    return LambdaLR(optimizer, lambda step: lr_factor(step, warmup_steps, total_steps, schedule, final_ratio))
