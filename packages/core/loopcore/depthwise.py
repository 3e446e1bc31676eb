"""A depthwise convolution whose weight gradient runs as a forward convolution.

On CPUs, oneDNN's depthwise weight-gradient kernel is the slowest part of a LoopVAE training step: for a
7×7 depthwise layer on ``8 × 48 × 64²`` channels-last maps it takes 23 ms where the forward takes 1.5 ms
for the same MACs (docs/benchmarks.md, ``loopvae profile --breakdown``). The weight gradient is a
correlation of each channel's padded input with its output gradient,

    dW[c, 0, i, j] = sum_{b, y, x} x_pad[b, c, y + i, x + j] * g[b, c, y, x],

which is itself a depthwise convolution once the batch joins the channels: the input is ``x`` as
``(1, B·C, H, W)`` padded by ``k // 2``, the "kernel" is ``g`` as ``(B·C, 1, H, W)``, the output
``(1, B·C, k, k)`` summed over ``B``. torch's forward depthwise kernel computes that several times faster
than its backward kernel (docs/benchmarks.md). Same MACs; equal to the native gradient up to float
summation order (tests/core/test_depthwise.py).

Only stride 1 and "same" padding (``k // 2``, odd ``k``), the ConvNeXt block's case, take this path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["depthwise_conv2d"]


class _DepthwiseConv2d(torch.autograd.Function):
    """``F.conv2d(x, weight, bias, padding=k // 2, groups=C)`` with the weight gradient described above."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        pad = weight.shape[-1] // 2
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.conv2d(x, weight, bias, padding=pad, groups=x.shape[1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        channels, k = x.shape[1], weight.shape[-1]
        pad = k // 2
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(
                grad, x, weight, None, [1, 1], [pad, pad], [1, 1], False, [0, 0], channels, [True, False, False])[0]
        if ctx.needs_input_grad[1]:
            batch, height, width = x.shape[0], x.shape[2], x.shape[3]
            # (B, C, H, W) -> (1, B*C, H, W): one group per (sample, channel). A free view of contiguous maps; a
            # channels-last map is copied once. Padding k // 2 makes the output k x k.
            maps = x.reshape(1, batch * channels, height, width)
            kernels = grad.reshape(batch * channels, 1, height, width)
            grad_w = F.conv2d(maps, kernels, padding=pad, groups=batch * channels).view(batch, channels, k, k)
            grad_w = grad_w.sum(0).unsqueeze(1)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum((0, 2, 3))
        return grad_x, grad_w, grad_b


def depthwise_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Depthwise ``k × k`` convolution, stride 1, ``k // 2`` zero padding.

    Args:
        x: ``(B, C, H, W)``, contiguous or channels-last.
        weight: ``(C, 1, k, k)`` with odd ``k``.
        bias: ``(C,)`` or ``None``.

    Returns:
        ``(B, C, H, W)``, equal to ``F.conv2d(x, weight, bias, padding=k // 2, groups=C)``; when a gradient is
        needed for ``weight``, it is computed as a forward convolution (module docstring).
    """
    if weight.ndim != 4 or weight.shape[1] != 1 or weight.shape[0] != x.shape[1] or weight.shape[2] != weight.shape[3] \
            or weight.shape[-1] % 2 == 0:
        raise ValueError(f"depthwise_conv2d: weight {tuple(weight.shape)} is not (C={x.shape[1]}, 1, k, k) with odd k")
    if torch.is_grad_enabled() and weight.requires_grad:
        return _DepthwiseConv2d.apply(x, weight, bias)
    return F.conv2d(x, weight, bias, padding=weight.shape[-1] // 2, groups=x.shape[1])
