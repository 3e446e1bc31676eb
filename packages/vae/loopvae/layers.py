"""The non-shared convolutional parts of a LoopVAE: stem, transitions, posterior head, latent
projection and output head.

The paper leaves these unspecified. Ours are plain 3x3 convolutions at the model width, chosen so
that ``loopvae-cnn-f8d16`` lands on the paper's 29.07M parameters and 700.92 GMACs (see
``docs/loopvae.md``): the encoder stem and the decoder output head each hold one full-width conv at
their resolution (128^2 and 256^2), the posterior head and the latent projection one each at the
latent resolution, and every transition is one stride-2 (down) or nearest-upsample (up) conv.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def norm(channels: int) -> nn.GroupNorm:
    """GroupNorm(32) with eps 1e-6 (falls back to fewer groups for narrow widths)."""
    groups = 32 if channels % 32 == 0 else max(g for g in (16, 8, 4, 2, 1) if channels % g == 0)
    return nn.GroupNorm(groups, channels, eps=1e-6)


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1)


class Stem(nn.Module):
    """``(B, 3, H, W)`` in [-1, 1] -> ``(B, C, H/2, W/2)``: stride-2 conv, GN, SiLU, conv."""

    def __init__(self, in_channels: int, width: int) -> None:
        super().__init__()
        self.conv_in = conv3x3(in_channels, width, stride=2)
        self.norm = norm(width)
        self.conv = conv3x3(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.silu(self.norm(self.conv_in(x))))


class Downsample(nn.Module):
    """Halve the resolution: stride-2 3x3 conv ``(B, C, H, W) -> (B, C, H/2, W/2)``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = conv3x3(width, width, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class Upsample(nn.Module):
    """Double the resolution: nearest upsampling then a 3x3 conv ``(B, C, H, W) -> (B, C, 2H, 2W)``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = conv3x3(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class PosteriorHead(nn.Module):
    """Features ``(B, C, h, w)`` -> diagonal-Gaussian moments ``(B, 2 * z, h, w)`` (mean, log-variance)."""

    def __init__(self, width: int, latent_channels: int) -> None:
        super().__init__()
        self.norm1 = norm(width)
        self.conv = conv3x3(width, width)
        self.norm2 = norm(width)
        self.conv_out = conv3x3(width, 2 * latent_channels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.conv(F.silu(self.norm1(h)))
        return self.conv_out(F.silu(self.norm2(h)))


class LatentProjection(nn.Module):
    """Latent ``(B, z, h, w)`` -> decoder features ``(B, C, h, w)``: conv, GN, SiLU, conv."""

    def __init__(self, latent_channels: int, width: int) -> None:
        super().__init__()
        self.conv_in = conv3x3(latent_channels, width)
        self.norm = norm(width)
        self.conv = conv3x3(width, width)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.conv(F.silu(self.norm(self.conv_in(z))))


class OutputHead(nn.Module):
    """Features ``(B, C, H/2, W/2)`` -> image ``(B, 3, H, W)`` (unbounded; [-1, 1] after training).

    GN, SiLU, nearest x2, conv at full resolution, GN, SiLU, conv to RGB. ``conv_out.weight`` is the
    "last layer" whose gradient norm sets the adaptive GAN weight.
    """

    def __init__(self, width: int, out_channels: int) -> None:
        super().__init__()
        self.norm1 = norm(width)
        self.conv = conv3x3(width, width)
        self.norm2 = norm(width)
        self.conv_out = conv3x3(width, out_channels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(F.silu(self.norm1(h)), scale_factor=2.0, mode="nearest")
        return self.conv_out(F.silu(self.norm2(self.conv(h))))
