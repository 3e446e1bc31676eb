"""Multi-head self-attention (2-D RoPE, optional non-overlapping windows) and the DiT-style operator.

**2-D rotary position embedding.** Half of each head's channels rotate with the row index, the other half
with the column index, so the attention logit between two tokens depends only on their 2-D offset. Angles
are computed on the fly (no buffers), which keeps modules constructible on the ``meta`` device and valid
for any grid size (tiles, non-square images).

All attention goes through :func:`torch.nn.functional.scaled_dot_product_attention`, so the same
code picks the flash / memory-efficient kernels on GPUs and the math kernel on CPUs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn


def rope_2d_cos_sin(
    height: int, width: int, head_dim: int, theta: float = 10000.0,
    device: torch.device | None = None, dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines for a ``height x width`` grid in row-major token order.

    Returns:
        ``(cos, sin)``, each ``(height * width, 2, head_dim // 2)``: axis 1 selects the row (0)
        or column (1) half of the head channels.
    """
    if head_dim % 4:
        raise ValueError(f"2-D RoPE needs head_dim divisible by 4, got {head_dim}")
    half = head_dim // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, 2, device=device, dtype=torch.float32) / half)
    rows = torch.arange(height, device=device, dtype=torch.float32)
    cols = torch.arange(width, device=device, dtype=torch.float32)
    ang_r = torch.outer(rows, inv_freq).repeat(1, 2)  # (H, half)
    ang_c = torch.outer(cols, inv_freq).repeat(1, 2)  # (W, half)
    ang = torch.stack(
        [ang_r[:, None, :].expand(height, width, half), ang_c[None, :, :].expand(height, width, half)],
        dim=2,
    ).reshape(height * width, 2, half)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def apply_rope_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``(..., N, head_dim)`` with tables from :func:`rope_2d_cos_sin`."""
    shape = x.shape
    x = x.unflatten(-1, (2, shape[-1] // 2))
    return (x * cos + _rotate_half(x) * sin).reshape(shape)


class Mlp(nn.Module):
    """Token MLP ``Linear(dim, hidden) -> GELU -> Linear(hidden, dim)`` on ``(..., dim)``."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """Self-attention over a token sequence ``(B, N, C)`` or a token grid ``(B, H, W, C)``.

    On grids, q and k get 2-D RoPE from their global grid position (when ``rope`` is on), and
    ``window_size`` restricts attention to non-overlapping ``w x w`` windows. Grids whose sides are
    not multiples of the window are padded and the padded keys masked out, so any image size works.

    Args:
        dim: channels ``C`` (divisible by ``num_heads``).
        num_heads: attention heads.
        qkv_bias: bias on the fused QKV projection.
        rope: apply 2-D RoPE on grids (needs ``head_dim % 4 == 0``).
        rope_theta: RoPE base frequency.
    """

    def __init__(
        self, dim: int, num_heads: int, qkv_bias: bool = True, rope: bool = True, rope_theta: float = 10000.0
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"Attention: dim={dim} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        if rope and self.head_dim % 4:
            raise ValueError(f"Attention: 2-D RoPE needs head_dim % 4 == 0, got head_dim={self.head_dim}")
        self.rope = rope
        self.rope_theta = rope_theta
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, window_size: int | None = None, queries: int | None = None
    ) -> torch.Tensor:
        """Attend. ``x``: ``(B, N, C)`` (global, no RoPE) or ``(B, H, W, C)``; returns the same shape.

        ``queries=k`` (sequences only) computes the output of the first ``k`` tokens alone, ``(B, k, C)``,
        still attending over all ``N`` keys: what a classifier head that reads only the class token needs
        from the last block, for a fraction of the query, projection and MLP work.
        """
        if x.ndim == 3:
            if window_size is not None:
                raise ValueError("window_size needs a (B, H, W, C) grid, got a (B, N, C) sequence")
            if queries is None:
                q, k, v = rearrange(self.qkv(x), "b n (three h d) -> three b h n d", three=3, h=self.num_heads)
            else:
                q, k, v = self._subset_qkv(x, queries)
            return self.proj(rearrange(F.scaled_dot_product_attention(q, k, v), "b h n d -> b n (h d)"))
        if queries is not None:
            raise ValueError("queries=... is for (B, N, C) sequences, not (B, H, W, C) grids")
        if x.ndim != 4:
            raise ValueError(f"Attention expects (B, N, C) or (B, H, W, C), got shape {tuple(x.shape)}")
        return self.proj(self._grid_attention(self.qkv(x), window_size))

    def _subset_qkv(self, x: torch.Tensor, queries: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # q for the first `queries` tokens only; k and v for all (rows of the fused QKV weight: q, k, v).
        if not 1 <= queries <= x.shape[1]:
            raise ValueError(f"queries must be in 1..{x.shape[1]} (the sequence length), got {queries}")
        dim = x.shape[-1]
        bias = self.qkv.bias
        q = F.linear(x[:, :queries], self.qkv.weight[:dim], None if bias is None else bias[:dim])
        kv = F.linear(x, self.qkv.weight[dim:], None if bias is None else bias[dim:])
        q = rearrange(q, "b n (h d) -> b h n d", h=self.num_heads)
        k, v = rearrange(kv, "b n (two h d) -> two b h n d", two=2, h=self.num_heads)
        return q, k, v

    def _grid_attention(self, qkv: torch.Tensor, window_size: int | None) -> torch.Tensor:
        b, height, width, _ = qkv.shape
        q, k, v = rearrange(qkv, "b y x (three h d) -> three b h (y x) d", three=3, h=self.num_heads)
        if self.rope:
            cos, sin = rope_2d_cos_sin(height, width, self.head_dim, self.rope_theta, q.device, q.dtype)
            q, k = apply_rope_2d(q, cos, sin), apply_rope_2d(k, cos, sin)
        if window_size is None or (height <= window_size and width <= window_size):
            out = F.scaled_dot_product_attention(q, k, v)
            return rearrange(out, "b h (y x) d -> b y x (h d)", y=height)
        ws = window_size
        pad_h, pad_w = -height % ws, -width % ws
        grid = [rearrange(t, "b h (y x) d -> b h d y x", y=height) for t in (q, k, v)]
        if pad_h or pad_w:
            grid = [F.pad(t, (0, pad_w, 0, pad_h)) for t in grid]
        q, k, v = (
            rearrange(t, "b h d (ny wy) (nx wx) -> (b ny nx) h (wy wx) d", wy=ws, wx=ws) for t in grid
        )
        mask = None
        if pad_h or pad_w:
            valid = torch.zeros(height + pad_h, width + pad_w, dtype=torch.bool, device=q.device)
            valid[:height, :width] = True
            valid = rearrange(valid, "(ny wy) (nx wx) -> (ny nx) 1 1 (wy wx)", wy=ws, wx=ws)
            mask = valid.repeat(b, 1, 1, 1)  # keys only; padded queries are cropped below
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = rearrange(
            out, "(b ny nx) h (wy wx) d -> b (ny wy) (nx wx) (h d)", b=b, ny=(height + pad_h) // ws, wy=ws
        )
        return out[:, :height, :width]


class AttentionOperator(nn.Module):
    """DiT-style operator on ``(B, H, W, C)`` token grids (channels last).

    ``N`` = affine-free LayerNorm (eps 1e-6); ``M1`` = QKV -> 2-D RoPE on q, k -> attention
    (windowed when the caller passes ``window_size``) -> out-projection; ``M2`` = C -> 4C -> C MLP (GELU).
    """

    features_last = True

    def __init__(
        self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True, rope: bool = True,
        rope_theta: float = 10000.0,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias, rope=rope, rope_theta=rope_theta)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def mix(self, x: torch.Tensor, window_size: int | None = None) -> torch.Tensor:
        """``M1`` on ``(B, H, W, C)`` (or ``(B, N, C)`` without windows)."""
        return self.attn(x, window_size)

    def modulated_forward(
        self, x: torch.Tensor, modulation: tuple[torch.Tensor, ...], window_size: int | None = None
    ) -> torch.Tensor:
        """The whole adaLN-Zero block for batch-shared ``(b1, g1, a1, b2, g2, a2)``, each ``(C,)``.

        ``(1 + g) * N(u) + b`` is one LayerNorm call with ``1 + g``, ``b`` as its affine parameters and each
        gated residual one ``addcmul``: fewer full-size passes than the plain formula, same result up to
        float rounding. ``x``: ``(B, H, W, C)`` or ``(B, N, C)``; returns the same shape.
        """
        b1, g1, a1, b2, g2, a2 = (p.to(x.dtype) for p in modulation)  # CPU norms refuse mixed dtypes
        shape, eps = x.shape[-1:], self.norm1.eps
        v = torch.addcmul(x, a1, self.attn(F.layer_norm(x, shape, 1 + g1, b1, eps), window_size))
        return torch.addcmul(v, a2, self.mlp(F.layer_norm(v, shape, 1 + g2, b2, eps)))
