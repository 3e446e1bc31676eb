"""Factories for the two modulated block types the looped cores are built from."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .attention import AttentionOperator
from .conv_operator import ConvOperator
from .modulation import ModulatedBlock


def conv_block(
    dim: int, cond_dim: int, kernel_size: int = 7, expansion: int = 4, groups: int = 32
) -> ModulatedBlock:
    """ConvNeXt-style adaLN-Zero block on ``(B, C, H, W)``."""
    return ModulatedBlock(dim, cond_dim, ConvOperator(dim, kernel_size, expansion, groups))


def attention_block(
    dim: int, cond_dim: int, num_heads: int, mlp_ratio: float = 4.0, rope: bool = True,
    rope_theta: float = 10000.0,
) -> ModulatedBlock:
    """DiT-style adaLN-Zero block on ``(B, H, W, C)`` grids (2-D RoPE, optional windows)."""
    return ModulatedBlock(dim, cond_dim, AttentionOperator(dim, num_heads, mlp_ratio, rope=rope, rope_theta=rope_theta))


def block_factory(kind: str, dim: int, cond_dim: int, **kwargs) -> Callable[[], nn.Module]:
    """Zero-argument factory for ``kind`` in ``{"conv", "attention"}`` (used by :class:`LoopedCore`)."""
    if kind == "conv":
        return lambda: conv_block(dim, cond_dim, **kwargs)
    if kind == "attention":
        return lambda: attention_block(dim, cond_dim, **kwargs)
    raise ValueError(f"unknown block kind {kind!r}; choose 'conv' or 'attention'")
