"""Overlapping-tile application of a spatial function with linear blending of the overlaps.

Used by :meth:`loopvae.LoopVAE.encode` / :meth:`~loopvae.LoopVAE.decode` when tiling is enabled:
memory is bounded by one tile's activations plus the output buffer, whatever the image size.
Blending is a normalised weighted sum: every tile's output is weighted by a separable ramp that
rises linearly across the overlap on each side that has a neighbour, and the accumulated sum is
divided by the accumulated weights, so seams fade smoothly and any overlap (including the larger
one of the last tile, which is shifted to end at the border) is handled exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def tile_starts(size: int, tile: int, overlap: int) -> list[int]:
    """Start offsets of tiles of side ``tile`` covering ``[0, size)`` with at least ``overlap`` overlap."""
    if tile <= overlap:
        raise ValueError(f"tile ({tile}) must be larger than the overlap ({overlap})")
    if size <= tile:
        return [0]
    stride = tile - overlap
    starts = list(range(0, size - tile, stride))
    starts.append(size - tile)
    return starts


def _ramp(length: int, ramp: int, left: bool, right: bool, device: torch.device) -> torch.Tensor:
    w = torch.ones(length, device=device)
    ramp = min(ramp, length)
    if ramp > 0:
        up = (torch.arange(ramp, device=device, dtype=torch.float32) + 0.5) / ramp
        if left:
            w[:ramp] = torch.minimum(w[:ramp], up)
        if right:
            w[-ramp:] = torch.minimum(w[-ramp:], up.flip(0))
    return w


def tiled_apply(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile: int, overlap: int, scale: float
) -> torch.Tensor:
    """Apply ``fn`` to overlapping ``tile x tile`` crops of ``x`` and blend the results.

    Args:
        fn: maps ``(B, C, t, t)`` to ``(B, C', t * scale, t * scale)``.
        x: ``(B, C, H, W)``; ``H`` and ``W`` need not be multiples of ``tile``.
        tile, overlap: tile side and minimum overlap in input pixels (``tile * scale`` and
            ``overlap * scale`` must be integers).
        scale: output/input resolution ratio (8 for a f8 decoder, 1/8 for its encoder).

    Returns:
        ``(B, C', H * scale, W * scale)`` in the dtype of ``fn``'s output.
    """
    _, _, height, width = x.shape
    ys, xs = tile_starts(height, tile, overlap), tile_starts(width, tile, overlap)
    out_h, out_w = round(height * scale), round(width * scale)
    ramp = round(overlap * scale)
    acc = weight = out_dtype = None
    for y0 in ys:
        for x0 in xs:
            crop = x[:, :, y0 : y0 + tile, x0 : x0 + tile]
            out = fn(crop)
            if acc is None:
                acc = torch.zeros(out.shape[0], out.shape[1], out_h, out_w, device=out.device, dtype=torch.float32)
                weight = torch.zeros(1, 1, out_h, out_w, device=out.device, dtype=torch.float32)
                out_dtype = out.dtype
            th, tw = out.shape[-2:]
            oy, ox = round(y0 * scale), round(x0 * scale)
            wy = _ramp(th, ramp, y0 > 0, y0 + tile < height, out.device)
            wx = _ramp(tw, ramp, x0 > 0, x0 + tile < width, out.device)
            w = (wy[:, None] * wx[None, :])[None, None]
            acc[:, :, oy : oy + th, ox : ox + tw] += out.float() * w
            weight[:, :, oy : oy + th, ox : ox + tw] += w
    return (acc / weight).to(out_dtype)
