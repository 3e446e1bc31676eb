"""Optimisation state besides the optimizer: learning-rate schedules (linear warm-up, then cosine decay or
constant) and the exponential moving average of a model's weights, as first-class training state."""

from __future__ import annotations

import copy
import math

import torch
from torch import nn
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


class EMA(nn.Module):
    """EMA copy of ``model`` with decay ``min(decay, (1 + n) / (10 + n))`` after ``n`` updates.

    The warm-up term lets the average follow the fast early changes instead of staying near the
    initialisation. ``ema.module`` is an ordinary model in eval mode (export it, evaluate it);
    ``state_dict`` holds the shadow weights and the update count, so resuming restores it exactly.
    Buffers are copied, not averaged.
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999) -> None:
        super().__init__()
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))

    def current_decay(self) -> float:
        n = int(self.num_updates)
        return min(self.decay, (1 + n) / (10 + n))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Blend ``model``'s current weights into the average (call after each optimizer step)."""
        decay = self.current_decay()
        ema_params = dict(self.module.named_parameters())
        for name, param in model.named_parameters():
            ema_params[name].lerp_(param.detach().to(ema_params[name].dtype), 1.0 - decay)
        ema_buffers = dict(self.module.named_buffers())
        for name, buf in model.named_buffers():
            ema_buffers[name].copy_(buf)
        self.num_updates += 1

    def train(self, mode: bool = True) -> EMA:
        # The averaged model always stays in eval mode.
        super().train(mode)
        self.module.eval()
        return self
