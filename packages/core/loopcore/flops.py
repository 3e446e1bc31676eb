"""Multiply-accumulate counting with :mod:`torch.utils.flop_counter`.

``FlopCounterMode`` counts convolutions, matmuls and the CUDA attention kernels, but not the CPU
flash-attention kernel that ``scaled_dot_product_attention`` dispatches to on CPUs; we register the
standard SDPA formula for it so counts agree on every device (on ``meta`` SDPA decomposes into
counted ``bmm`` calls). For training steps we also replace torch's convolution-backward formula,
which ignores ``groups`` in the weight gradient (a depthwise 7x7 layer's backward would count C times
its real arithmetic). MACs are FLOPs / 2, as the papers report them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
    shape_wrapper,
)

_aten = torch.ops.aten


def _cpu_flash_sdpa_flop(query_shape, key_shape, value_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args: Any, out_shape=None,
                                  **kwargs: Any) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _conv_macs(x_shape, w_shape, out_shape, transposed: bool) -> int:
    """MACs of one convolution, groups included: the weight holds ``C_out x C_in/groups x k...`` (transposed:
    ``C_in x C_out/groups x k...``) and each weight element meets every position of the non-upsampled side."""
    spatial = (x_shape if transposed else out_shape)[2:]
    return x_shape[0] * math.prod(spatial) * math.prod(w_shape)


def _conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, out_shape=None) -> int:
    """The input gradient and the weight gradient each cost the forward's MACs. torch's own formula (2.14)
    leaves ``groups`` out of the weight gradient, over-counting a depthwise convolution's by its channel count."""
    forward = _conv_macs(x_shape, w_shape, grad_out_shape, transposed)
    return 2 * forward * (int(output_mask[0]) + int(output_mask[1]))


def _custom_mapping() -> dict:
    """Our formulas, keyed by overload packet: the CPU flash-attention kernels (forward and backward, which torch's
    registry lacks) and the convolution backward with groups (see :func:`_conv_backward_flop`)."""
    mapping = {_aten.convolution_backward: _conv_backward_flop}
    if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[_aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_sdpa_flop
    if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        mapping[_aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_flash_sdpa_backward_flop
    return mapping


def flop_formulas() -> dict:
    """``{aten overload packet: formula(*args, out_val=out, **kwargs) -> FLOPs}``: torch's registry plus ours."""
    return {**flop_registry, **{k: shape_wrapper(v) for k, v in _custom_mapping().items()}}


def count_macs(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Run ``fn(*args, **kwargs)`` once under a FLOP counter and return its MACs (FLOPs / 2).

    Counts convolutions, linear layers / matmuls and attention matmuls; elementwise work, norms and
    softmax are not counted (the papers' convention). Use ``meta`` tensors for free counts of big models.
    """
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=_custom_mapping()) as counter:
        fn(*args, **kwargs)
    return counter.get_total_flops() // 2


def count_parameters(module: torch.nn.Module) -> int:
    """Stored parameters of ``module`` (a shared module called many times counts once)."""
    return sum(p.numel() for p in module.parameters())
