"""Multiply-accumulate counting with :mod:`torch.utils.flop_counter`.

``FlopCounterMode`` counts convolutions, matmuls and the CUDA attention kernels, but not the CPU
flash-attention kernel that ``scaled_dot_product_attention`` dispatches to on CPUs; we register the
standard SDPA formula for it so counts agree on every device (on ``meta`` SDPA decomposes into
counted ``bmm`` calls). MACs are FLOPs / 2, as the papers report them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

_aten = torch.ops.aten


def _cpu_flash_sdpa_flop(query_shape, key_shape, value_shape, *args: Any, out_shape=None, **kwargs: Any) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _custom_mapping() -> dict:
    mapping = {}
    if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[_aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_sdpa_flop
    return mapping


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
