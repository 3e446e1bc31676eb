"""adaLN-Zero modulated residual block with an injectable operator.

For a conditioning vector ``c`` the block computes ``(b1, g1, a1, b2, g2, a2) = W SiLU(c) + bias``
(a zero-initialised ``cond_dim -> 6 * dim`` linear) and

    v = u + a1 * M1((1 + g1) * N1(u) + b1)
    y = v + a2 * M2((1 + g2) * N2(v) + b2)

Because ``W`` and ``bias`` start at zero, every block is exactly the identity at initialisation.
The operator (``N1, M1, N2, M2`` and the tensor layout) is injected, as timm injects
``attn_layer``/``mlp_layer``: see :class:`loopcore.ConvOperator` and :class:`loopcore.AttentionOperator`.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn


class BlockOperator(Protocol):
    """What a :class:`ModulatedBlock` needs from its operator.

    ``channels_last`` says where the channel axis is: ``False`` for ``(B, C, H, W)`` feature
    maps, ``True`` for ``(B, ..., C)`` token grids or sequences.
    """

    channels_last: bool
    norm1: nn.Module
    norm2: nn.Module
    mlp: nn.Module

    def mix(self, x: torch.Tensor, window_size: int | None = None) -> torch.Tensor: ...


def broadcast_modulation(vec: torch.Tensor, like: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """Reshape a ``(C,)`` or ``(B, C)`` modulation vector so it broadcasts over ``like``.

    Returns shape ``(B|1, 1, ..., 1, C)`` when ``channels_last`` else ``(B|1, C, 1, ..., 1)``.
    """
    if vec.ndim == 1:
        vec = vec.unsqueeze(0)
    spatial = like.ndim - 2
    if channels_last:
        return vec.reshape(vec.shape[0], *([1] * spatial), vec.shape[1])
    return vec.reshape(vec.shape[0], vec.shape[1], *([1] * spatial))


def set_fused_blocks(module: nn.Module, fused: bool = True) -> nn.Module:
    """Switch every :class:`ModulatedBlock` inside ``module`` to the fused path (``True``) or the plain
    written formula (``False``, the reference); returns ``module``."""
    for block in module.modules():
        if isinstance(block, ModulatedBlock):
            block.fused = fused
    return module


class ModulatedBlock(nn.Module):
    """One adaLN-Zero block around an operator (conv or attention).

    Args:
        dim: feature width ``C``.
        cond_dim: width of the conditioning vector ``c``.
        operator: module providing ``norm1``, ``mix`` (M1), ``norm2``, ``mlp`` (M2) and ``channels_last``.
    """

    def __init__(self, dim: int, cond_dim: int, operator: nn.Module) -> None:
        super().__init__()
        self.dim = dim
        self.operator = operator
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(cond_dim, 6 * dim))
        # Operators with a ``modulated_forward`` compute the same block with fewer full-size passes
        # when the modulation is shared by the batch; False forces the plain formula below (reference).
        self.fused = True
        self.reset_modulation()

    def reset_modulation(self) -> None:
        """Zero the modulation (weights and bias): the block becomes the exact identity."""
        nn.init.zeros_(self.modulation[1].weight)
        nn.init.zeros_(self.modulation[1].bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, window_size: int | None = None) -> torch.Tensor:
        """Apply the block.

        Args:
            x: features, ``(B, C, H, W)`` for a channels-first operator or ``(B, ..., C)`` for a
                channels-last one; any real range.
            cond: conditioning ``(cond_dim,)`` shared by the batch, or ``(B, cond_dim)``.
            window_size: attention window side for this call (``None`` = global); conv ignores it.

        Returns:
            Tensor with the shape and layout of ``x``.
        """
        op = self.operator
        # One small GEMM per block application. Batching a stage's applications per stored block was
        # measured (0.2% of CPU time for all of them) and dropped: its GEMM shapes depend on the sharing
        # rule, which broke the bit-exact equality of global / scale / none sharing with equal weights.
        modulation = self.modulation(cond)
        if modulation.ndim == 1 and self.fused and hasattr(op, "modulated_forward"):
            return op.modulated_forward(x, modulation.chunk(6), window_size)
        params = modulation.chunk(6, dim=-1)
        b1, g1, a1, b2, g2, a2 = (broadcast_modulation(p, x, op.channels_last) for p in params)
        v = x + a1 * op.mix((1 + g1) * op.norm1(x) + b1, window_size)
        return v + a2 * op.mlp((1 + g2) * op.norm2(v) + b2)
