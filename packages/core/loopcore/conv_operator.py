"""ConvNeXt-style convolutional operator for :class:`loopcore.ModulatedBlock`.

``N`` = affine-free GroupNorm(32, eps 1e-6) (the affine part is the block's modulation, "AdaGN");
``M1`` = depthwise 7x7 -> SiLU -> 1x1; ``M2`` = 1x1 C->4C -> SiLU -> 1x1 4C->C. Layout ``(B, C, H, W)``
in either torch memory format.

:meth:`ConvOperator.modulated_forward` is the whole block for a modulation shared by the batch (the
looped cores' case: ``c_{s,t}`` depends on the scale and pass only), with the arithmetic regrouped so
that fewer full-size maps are written: ``(1 + g) * N(u) + b`` is one GroupNorm call with ``1 + g`` and
``b`` as its affine parameters, and the gate ``a`` of each residual ``u + a * M(...)`` is folded into the
weights and bias of ``M``'s last 1x1 convolution (``diag(a) W``, ``a * bias``: ``C x C`` and ``C x 4C``
products instead of a pass over the map). Same parameters, same MACs; outputs equal the plain formula up
to float rounding (tests/core/test_fused_blocks.py). Its depthwise convolution computes the weight
gradient as a forward convolution (:mod:`loopcore.depthwise`), 2-3x faster on CPUs than oneDNN's kernel.

Measured on the 2-core CPU (docs/benchmarks.md): with channels-last maps oneDNN's 1x1 convolutions run
at 104-110 GMAC/s against 61-92 GMAC/s for the same products as ``addmm`` on the token matrix, so the
1x1s stay convolutions rather than GEMMs on a view.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .depthwise import depthwise_conv2d


class ConvOperator(nn.Module):
    """Convolutional operator (spatial mixing by a depthwise conv, channel mixing by 1x1 convs).

    Args:
        dim: channels ``C`` (must be divisible by ``groups``).
        kernel_size: depthwise kernel side (odd; 7 in the paper).
        expansion: hidden width factor of ``M2`` (4 in the paper).
        groups: GroupNorm groups (32 in the paper).
    """

    features_last = False

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

    def modulated_forward(
        self, x: torch.Tensor, modulation: tuple[torch.Tensor, ...], window_size: int | None = None
    ) -> torch.Tensor:
        """The block ``y`` of :class:`loopcore.ModulatedBlock` for batch-shared modulation vectors.

        Args:
            x: ``(B, C, H, W)``, contiguous or channels-last (the convolutions keep its memory format).
            modulation: ``(b1, g1, a1, b2, g2, a2)``, each ``(C,)``.
            window_size: must be ``None`` (no windows for convs).

        Returns:
            ``(B, C, H, W)`` in the memory format of ``x``.
        """
        if window_size is not None:
            raise ValueError("ConvOperator has no attention windows; configure window sizes only for attention")
        # the folded affine parameters take the input's dtype: CPU norms refuse mixed float32 / bf16 pairs
        # (under autocast the modulation comes out in bf16 while the stem hands float32 maps, or back)
        b1, g1, a1, b2, g2, a2 = (p.to(x.dtype) for p in modulation)
        groups, eps = self.norm1.num_groups, self.norm1.eps
        dw, _, pw = self.spatial
        fc1, _, fc2 = self.mlp
        # SiLU in place on the fresh conv outputs when nothing records them for a backward pass: one
        # full-size (4C-wide for M2) allocation less per block.
        inplace = not torch.is_grad_enabled()
        h = F.silu(depthwise_conv2d(F.group_norm(x, groups, 1 + g1, b1, eps), dw.weight, dw.bias), inplace=inplace)
        v = x + _gated_conv(pw, h, a1)
        h = F.silu(fc1(F.group_norm(v, groups, 1 + g2, b2, eps)), inplace=inplace)
        return v + _gated_conv(fc2, h, a2)


def _gated_conv(conv: nn.Conv2d, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``gate[:, None, None] * conv(h)`` as one convolution with the gate folded into weight and bias."""
    weight = conv.weight * gate.view(-1, *([1] * (conv.weight.ndim - 1)))
    bias = None if conv.bias is None else conv.bias * gate
    return conv._conv_forward(h, weight, bias)
