"""Shared test helpers: deterministic seeds and parameter randomisation.

Blocks start as the exact identity (zero-initialised modulation), so identity tests on freshly built
modules would pass trivially; ``randomize_`` gives every parameter a non-zero random value first.
"""

from __future__ import annotations

import pytest
import torch


def randomize_(module: torch.nn.Module, std: float = 0.05, seed: int = 0) -> torch.nn.Module:
    """Overwrite every floating parameter of ``module`` with N(0, std^2) values (in place)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return module


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    torch.manual_seed(0)
