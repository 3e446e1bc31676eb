"""DiffAugment (Zhao et al., 2020): differentiable colour, translation and cutout augmentation.

Applied identically in kind (independently drawn per sample) to real and generated images before
the discriminator, so D cannot memorise a small data set while G still receives gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _color(x: torch.Tensor) -> torch.Tensor:
    b = x.shape[0]
    rand = lambda: torch.rand(b, 1, 1, 1, device=x.device, dtype=x.dtype)
    x = x + (rand() - 0.5)  # brightness
    mean = x.mean(dim=1, keepdim=True)
    x = (x - mean) * (rand() * 2) + mean  # saturation
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * (rand() + 0.5) + mean  # contrast


def _translation(x: torch.Tensor, ratio: float = 0.125) -> torch.Tensor:
    b, _, h, w = x.shape
    sy, sx = int(h * ratio + 0.5), int(w * ratio + 0.5)
    ty = torch.randint(-sy, sy + 1, (b, 1, 1), device=x.device)
    tx = torch.randint(-sx, sx + 1, (b, 1, 1), device=x.device)
    gy, gx = torch.meshgrid(torch.arange(h, device=x.device), torch.arange(w, device=x.device), indexing="ij")
    # shift by (ty, tx) with zero fill: index into a 1-pixel zero-padded copy
    yy = (gy[None] + ty + 1).clamp(0, h + 1)
    xx = (gx[None] + tx + 1).clamp(0, w + 1)
    padded = F.pad(x, (1, 1, 1, 1))
    idx = (yy * (w + 2) + xx).flatten(1)  # (B, H*W)
    flat = padded.flatten(2)  # (B, C, (H+2)*(W+2))
    return flat.gather(2, idx[:, None].expand(-1, x.shape[1], -1)).view_as(x)


def _cutout(x: torch.Tensor, ratio: float) -> torch.Tensor:
    b, _, h, w = x.shape
    ch, cw = int(h * ratio + 0.5), int(w * ratio + 0.5)
    if ch == 0 or cw == 0:
        return x
    # square centred anywhere in the image (it may be clipped at the border)
    top = torch.randint(0, h, (b, 1, 1), device=x.device) - ch // 2
    left = torch.randint(0, w, (b, 1, 1), device=x.device) - cw // 2
    gy = torch.arange(h, device=x.device)[None, :, None]
    gx = torch.arange(w, device=x.device)[None, None, :]
    inside = (gy >= top) & (gy < top + ch) & (gx >= left) & (gx < left + cw)
    return x * (~inside).unsqueeze(1).to(x.dtype)


def diff_augment(
    x: torch.Tensor, p: float = 1.0, cutout: float = 0.2, policy: tuple[str, ...] = ("color", "translation", "cutout")
) -> torch.Tensor:
    """Augment ``(B, C, H, W)`` images (any range); each policy applies with probability ``p`` per batch.

    ``cutout`` is the side of the erased square as a fraction of the image side (0.2 in LoopVAE).
    """
    for name in policy:
        if p < 1.0 and float(torch.rand(())) >= p:
            continue
        if name == "color":
            x = _color(x)
        elif name == "translation":
            x = _translation(x)
        elif name == "cutout":
            x = _cutout(x, cutout)
        else:
            raise ValueError(f"unknown DiffAugment policy {name!r}; choose color, translation, cutout")
    return x
