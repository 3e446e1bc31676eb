"""2-D rotary position embedding (RoPE) for attention over image token grids.

Half of each head's channels rotate with the row index, the other half with the column index,
so the attention logit between two tokens depends only on their 2-D offset. Angles are computed
on the fly (no buffers), which keeps modules constructible on the ``meta`` device and valid for
any grid size (tiles, non-square images).
"""

from __future__ import annotations

import torch


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
