"""The pre-norm ViT block (DeiT / timm layout) and stochastic depth, built from loopcore's attention parts.

``PreNormBlock`` is the block the recursive classifiers reuse: bViT applies one of them ``T`` times,
SR-ViT applies each of its blocks ``R`` times. Unlike :class:`loopcore.ModulatedBlock` it has no
conditioning input (bViT has "no step conditioning") and affine LayerNorms, so its parameter count
is exactly a DeiT block's: ``12 d^2 + 13 d`` for MLP ratio 4.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention, Mlp


def drop_path(x: torch.Tensor, prob: float, training: bool) -> torch.Tensor:
    """Stochastic depth on a residual branch ``x`` of shape ``(B, ...)``.

    In training, each sample's branch is zeroed with probability ``prob`` and otherwise scaled by
    ``1 / (1 - prob)`` (so its expectation is unchanged); in eval, or with ``prob == 0``, ``x`` is returned
    as is (the same tensor object, so the no-drop path is bit-identical to a block without drop-path).
    """
    if prob == 0.0 or not training:
        return x
    if not 0.0 <= prob < 1.0:
        raise ValueError(f"drop-path probability must be in [0, 1), got {prob}")
    keep = 1.0 - prob
    mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
    return x * mask.div_(keep)


class PreNormBlock(nn.Module):
    """``x + Attn(LN(x))`` then ``x + MLP(LN(x))`` on token sequences ``(B, N, C)``.

    Args:
        dim: width ``C`` (divisible by ``num_heads``).
        num_heads: attention heads (global attention through ``scaled_dot_product_attention``).
        mlp_ratio: MLP hidden width / ``C``.
        qkv_bias: bias on the QKV projection (DeiT: on).
        norm_eps: LayerNorm epsilon (timm's ViTs use 1e-6).
    """

    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, norm_eps: float = 1e-6
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias, rope=False)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor, drop_prob: float = 0.0, queries: int | None = None) -> torch.Tensor:
        """Apply the block to ``(B, N, C)`` tokens; ``drop_prob`` is this application's stochastic depth.

        ``queries=k`` returns only the first ``k`` output tokens ``(B, k, C)`` (they still attend to all
        ``N``); the rest of the sequence is not computed. Equal to ``forward(x)[:, :k]`` up to float
        rounding, with the same drop-path draws.
        """
        # No named intermediates: each branch output is freed as soon as it is added, so the allocator
        # reuses its memory for the next branch (keeping it alive costs fresh pages and ~5% on CPU).
        residual = x if queries is None else x[:, :queries]
        x = residual + drop_path(self.attn(self.norm1(x), queries=queries), drop_prob, self.training)
        return x + drop_path(self.mlp(self.norm2(x)), drop_prob, self.training)
