"""Session-wide test settings: deterministic seeds."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    torch.manual_seed(0)
