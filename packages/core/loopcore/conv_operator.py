"""ConvNeXt-style convolutional operator for :class:`loopcore.ModulatedBlock`.

``N`` = affine-free GroupNorm(32, eps 1e-6) (the affine part is the block's modulation, "AdaGN");
``M1`` = depthwise 7x7 -> SiLU -> 1x1; ``M2`` = 1x1 C->4C -> SiLU -> 1x1 4C->C. Layout ``(B, C, H, W)``.
"""

from __future__ import annotations

import torch
from torch import nn


class ConvOperator(nn.Module):
    """Convolutional operator (spatial mixing by a depthwise conv, channel mixing by 1x1 convs).

    Args:
        dim: channels ``C`` (must be divisible by ``groups``).
        kernel_size: depthwise kernel side (odd; 7 in the paper).
        expansion: hidden width factor of ``M2`` (4 in the paper).
        groups: GroupNorm groups (32 in the paper).
    """

    channels_last = False

    def __init__(self, dim: int, kernel_size: int = 7, expansion: int = 4, groups: int = 32) -> None:
        super().__init__()
        if dim % groups:
            raise ValueError(f"ConvOperator: dim={dim} is not divisible by GroupNorm groups={groups}")
        if kernel_size % 2 == 0:
            raise ValueError(f"ConvOperator: kernel_size must be odd, got {kernel_size}")
        self.norm1 = nn.GroupNorm(groups, dim, eps=1e-6, affine=False)
        self.spatial = nn.Sequential(
            nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim),
            nn.SiLU(),
            nn.Conv2d(dim, dim, 1),
        )
        self.norm2 = nn.GroupNorm(groups, dim, eps=1e-6, affine=False)
        self.mlp = nn.Sequential(
            nn.Conv2d(dim, expansion * dim, 1),
            nn.SiLU(),
            nn.Conv2d(expansion * dim, dim, 1),
        )

    def mix(self, x: torch.Tensor, window_size: int | None = None) -> torch.Tensor:
        """``M1`` on ``(B, C, H, W)``; ``window_size`` must be ``None`` (no windows for convs)."""
        if window_size is not None:
            raise ValueError("ConvOperator has no attention windows; configure window sizes only for attention")
        return self.spatial(x)
