"""Conditioning and adaLN-Zero modulated blocks: ``c = e_s + e_t``, the block, the two block factories.

**Conditioning** (:class:`ScaleLoopEmbedding`). The conditioning vector only ever feeds the adaLN-Zero
modulation of the blocks, never the features themselves, so a block that is reused at several scales and
passes can still behave differently at each of them.

**The modulated block** (:class:`ModulatedBlock`, an injectable operator).

For a conditioning vector ``c`` the block computes ``(b1, g1, a1, b2, g2, a2) = W SiLU(c) + bias``
(a zero-initialised ``cond_dim -> 6 * dim`` linear) and

    v = u + a1 * M1((1 + g1) * N1(u) + b1)
    y = v + a2 * M2((1 + g2) * N2(v) + b2)

Because ``W`` and ``bias`` start at zero, every block is exactly the identity at initialisation.
The operator (``N1, M1, N2, M2`` and the tensor layout) is injected, as timm injects
``attn_layer``/``mlp_layer``: see :class:`loopcore.ConvOperator` and :class:`loopcore.AttentionOperator`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn

from .attention import AttentionOperator
from .conv_operator import ConvOperator


class BlockOperator(Protocol):
    """What a :class:`ModulatedBlock` needs from its operator.

    ``features_last`` says where the channel axis is: ``False`` for ``(B, C, H, W)`` feature
    maps, ``True`` for ``(B, ..., C)`` token grids or sequences.
    """

    features_last: bool
    norm1: nn.Module
    norm2: nn.Module
    mlp: nn.Module

    def mix(self, x: torch.Tensor, window_size: int | None = None) -> torch.Tensor: ...


def broadcast_modulation(vec: torch.Tensor, like: torch.Tensor, features_last: bool) -> torch.Tensor:
    """Reshape a ``(C,)`` or ``(B, C)`` modulation vector so it broadcasts over ``like``.

    Returns shape ``(B|1, 1, ..., 1, C)`` when ``features_last`` else ``(B|1, C, 1, ..., 1)``.
    """
    if vec.ndim == 1:
        vec = vec.unsqueeze(0)
    spatial = like.ndim - 2
    if features_last:
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
        operator: module providing ``norm1``, ``mix`` (M1), ``norm2``, ``mlp`` (M2) and ``features_last``.
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
        b1, g1, a1, b2, g2, a2 = (broadcast_modulation(p, x, op.features_last) for p in params)
        v = x + a1 * op.mix((1 + g1) * op.norm1(x) + b1, window_size)
        return v + a2 * op.mlp((1 + g2) * op.norm2(v) + b2)


class ScaleLoopEmbedding(nn.Module):
    """Learned lookup embeddings for the scale index ``s`` and the loop-pass index ``t``.

    Args:
        num_scales: number of scales (stages) the core runs at.
        max_loops: largest number of passes any scale runs (size of the loop table).
        dim: width of the conditioning vector.
    """

    def __init__(self, num_scales: int, max_loops: int, dim: int) -> None:
        super().__init__()
        if num_scales < 1 or max_loops < 1 or dim < 1:
            raise ValueError(
                f"ScaleLoopEmbedding needs positive sizes, got num_scales={num_scales}, "
                f"max_loops={max_loops}, dim={dim}"
            )
        self.num_scales = num_scales
        self.max_loops = max_loops
        self.scale = nn.Embedding(num_scales, dim)
        self.loop = nn.Embedding(max_loops, dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Unit-variance embeddings (nn.Embedding's own default), as DiT's conditioning vectors are O(1):
        # c only enters through SiLU into the zero-initialised modulation, so the block is still the
        # identity at init, but with std 0.02 SiLU(c) ~ c / 2 ~ 0.01 and the per-(scale, pass) part of
        # the modulation would need weights ~100x larger than the shared bias before passes could
        # differ. Measured on the tiny LoopVAE: with 0.02 the cores stayed near the identity after 600 steps.
        nn.init.normal_(self.scale.weight, std=1.0)
        nn.init.normal_(self.loop.weight, std=1.0)

    def forward(self, scale: int, loop: int) -> torch.Tensor:
        """Return ``c_{s,t}`` with shape ``(dim,)`` (shared by the whole batch)."""
        if not 0 <= scale < self.num_scales:
            raise IndexError(f"scale index {scale} outside [0, {self.num_scales})")
        if not 0 <= loop < self.max_loops:
            raise IndexError(f"loop index {loop} outside [0, {self.max_loops}); raise max_loops")
        return self.scale.weight[scale] + self.loop.weight[loop]


# -- block factories --------------------------------------------------------------------------------------
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
