"""The non-shared convolutional parts of a LoopVAE: stem, transitions, posterior head, latent
projection and output head.

The paper leaves these unspecified. Ours are plain 3x3 convolutions at the model width, chosen so
that ``loopvae-cnn-f8d16`` lands on the paper's 29.07M parameters and 700.92 GMACs (see
``docs/loopvae.md``): the encoder stem and the decoder output head each hold one full-width conv at
their resolution (128^2 and 256^2), the posterior head and the latent projection one each at the
latent resolution, and every transition is one stride-2 (down) or nearest-upsample (up) conv.

``shortcuts`` (a LoopVAE config key; our addition, not the paper's) switches on parameter-free
paths around every part that changes resolution or width: DC-AE-style space-to-channel /
channel-averaging shortcuts (Chen et al., 2024) into the stem, the posterior mean, out of the latent
and into RGB, and 2x2 average pooling / nearest upsampling around the transitions. With them the
untrained autoencoder is already close to box down- and up-sampling, and a network can reconstruct
without its looped cores doing any work (measured: with every conv of ``loopvae-cnn-tiny`` zeroed the
shortcut path alone gives 21.9 dB on kodim21-24, an 8x box filter). Without them (``shortcuts=False``,
the paper's models and the default of every registered LoopVAE) stem, transitions and heads are plain
convolutions and every pixel of the reconstruction has to pass through the cores. They add no
parameters and no MACs either way, so the counted figures do not depend on the switch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def norm(channels: int, groups: int = 32) -> nn.GroupNorm:
    """GroupNorm with eps 1e-6 and ``groups`` groups (fewer if ``channels`` is not divisible)."""
    while channels % groups:
        groups -= 1
    return nn.GroupNorm(groups, channels, eps=1e-6)


def conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1)


def channel_average(x: torch.Tensor, channels: int) -> torch.Tensor:
    """``(B, C, H, W) -> (B, channels, H, W)`` by averaging groups of ``C / channels`` adjacent channels.

    With :func:`channel_repeat` this is DC-AE's parameter-free shortcut between a wide feature map and
    a narrow latent (Chen et al., 2024): encoder and decoder get an identity-like path through the
    bottleneck, which makes high-compression autoencoders train much faster.
    """
    b, c, h, w = x.shape
    if c % channels:
        raise ValueError(f"cannot average {c} channels into {channels} groups")
    return x.reshape(b, channels, c // channels, h, w).mean(dim=2)


def channel_repeat(z: torch.Tensor, channels: int) -> torch.Tensor:
    """``(B, c, H, W) -> (B, channels, H, W)`` repeating each channel ``channels / c`` times (inverse layout
    of :func:`channel_average`)."""
    if channels % z.shape[1]:
        raise ValueError(f"cannot repeat {z.shape[1]} channels into {channels}")
    return z.repeat_interleave(channels // z.shape[1], dim=1)


class Stem(nn.Module):
    """``(B, 3, H, W)`` in [-1, 1] -> ``(B, C, H/2, W/2)``: stride-2 conv, then a residual GN-SiLU-conv.

    With ``shortcuts`` and ``C`` a multiple of ``4 * in_channels``, the stride-2 conv gets a
    space-to-channel shortcut (pixel unshuffle, channels repeated up to ``C``).
    """

    def __init__(self, in_channels: int, width: int, groups: int = 32, shortcuts: bool = False) -> None:
        super().__init__()
        self.conv_in = conv3x3(in_channels, width, stride=2)
        self.norm = norm(width, groups)
        self.conv = conv3x3(width, width)
        self.shortcut = shortcuts and width % (4 * in_channels) == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        if self.shortcut:
            h = h + channel_repeat(F.pixel_unshuffle(x, 2), h.shape[1])
        return h + self.conv(F.silu(self.norm(h)))


class Downsample(nn.Module):
    """Halve the resolution: stride-2 3x3 conv (plus a 2x2 average-pool shortcut with ``shortcuts``)."""

    def __init__(self, width: int, shortcuts: bool = False) -> None:
        super().__init__()
        self.conv = conv3x3(width, width, stride=2)
        self.shortcut = shortcuts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return h + F.avg_pool2d(x, 2) if self.shortcut else h


class Upsample(nn.Module):
    """Double the resolution: nearest upsampling, then a 3x3 conv (added to its input with ``shortcuts``)."""

    def __init__(self, width: int, shortcuts: bool = False) -> None:
        super().__init__()
        self.conv = conv3x3(width, width)
        self.shortcut = shortcuts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        return x + self.conv(x) if self.shortcut else self.conv(x)


class PosteriorHead(nn.Module):
    """Features ``(B, C, h, w)`` -> diagonal-Gaussian moments ``(B, 2 * z, h, w)`` (mean, log-variance).

    The log-variance half starts at ``initial_logvar`` everywhere (zero weights, constant bias): with the
    usual init it would start near 0 (sigma ~ 1), and posterior samples would drown the latent in noise
    until training has pushed it down. -6 gives sigma ~ 0.05, the level of the training latent noise.
    """

    def __init__(
        self, width: int, latent_channels: int, groups: int = 32, initial_logvar: float = -6.0, shortcuts: bool = False
    ) -> None:
        super().__init__()
        self.shortcut = shortcuts
        self.norm1 = norm(width, groups)
        self.conv = conv3x3(width, width)
        self.norm2 = norm(width, groups)
        self.conv_out = conv3x3(width, 2 * latent_channels)
        with torch.no_grad():
            self.conv_out.weight[latent_channels:].zero_()
            self.conv_out.bias[latent_channels:].fill_(initial_logvar)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.conv(F.silu(self.norm1(h)))
        moments = self.conv_out(F.silu(self.norm2(h)))
        if not self.shortcut:
            return moments
        mean, logvar = moments.chunk(2, dim=1)
        return torch.cat([mean + channel_average(h, mean.shape[1]), logvar], dim=1)


class LatentProjection(nn.Module):
    """Latent ``(B, z, h, w)`` -> decoder features ``(B, C, h, w)``: conv, then a residual GN-SiLU-conv.

    With ``shortcuts`` the first conv gets a channel-repeat shortcut of the latent.
    """

    def __init__(self, latent_channels: int, width: int, groups: int = 32, shortcuts: bool = False) -> None:
        super().__init__()
        self.conv_in = conv3x3(latent_channels, width)
        self.norm = norm(width, groups)
        self.conv = conv3x3(width, width)
        self.shortcut = shortcuts

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        if self.shortcut:
            h = h + channel_repeat(z, self.conv_in.out_channels)
        return h + self.conv(F.silu(self.norm(h)))


class OutputHead(nn.Module):
    """Features ``(B, C, H/2, W/2)`` -> image ``(B, 3, H, W)`` (unbounded; [-1, 1] after training).

    Nearest x2, a residual GN-SiLU-conv at full resolution, then GN, SiLU, conv to RGB (plus a
    channel-average shortcut of the features with ``shortcuts``).
    ``conv_out.weight`` is the "last layer" whose gradient norm sets the adaptive GAN weight.
    """

    def __init__(self, width: int, out_channels: int, groups: int = 32, shortcuts: bool = False) -> None:
        super().__init__()
        self.norm1 = norm(width, groups)
        self.conv = conv3x3(width, width)
        self.norm2 = norm(width, groups)
        self.conv_out = conv3x3(width, out_channels)
        self.shortcut = shortcuts and width % out_channels == 0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        h = h + self.conv(F.silu(self.norm1(h)))
        out = self.conv_out(F.silu(self.norm2(h)))
        return out + channel_average(h, out.shape[1]) if self.shortcut else out
