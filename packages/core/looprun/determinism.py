"""Per-step reseeding and weight digests: what makes resumed and multi-rank runs checkable."""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def seed_step(seed: int, rank: int, step: int) -> None:
    """Reseed the global torch RNG from ``(seed, rank, step)``.

    Every random draw of a training step (noise, augmentation, drop-path) then depends only on these
    three numbers, so a run resumed at step ``n`` draws exactly what an uninterrupted run draws.
    """
    digest = hashlib.sha256(f"{seed}/{rank}/{step}".encode()).digest()
    torch.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def state_digest(model: nn.Module) -> str:
    """sha256 over every state-dict entry (names and raw bytes): equal digests = identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
