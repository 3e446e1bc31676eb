"""Session-wide test settings: deterministic seeds; the system CPU allocator for in-process command lines."""

from __future__ import annotations

import os

import pytest
import torch

# The command lines default to retaining freed CPU memory (looprun.speed), a process-wide and irreversible
# glibc setting. Tests call them in-process and several measure peak resident memory, so the suite keeps
# malloc's defaults; tests/core/test_speed.py exercises the retained allocator in subprocesses.
os.environ["LOOPVISION_CPU_ALLOCATOR"] = "system"


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    torch.manual_seed(0)
