"""Session-wide test settings: deterministic seeds; the system CPU allocator for in-process command lines."""

from __future__ import annotations

import os

import pytest
import torch

# The command lines default to retaining freed CPU memory (looprun.speed), a process-wide and irreversible
# glibc setting. Tests call them in-process and several measure peak resident memory, so the suite keeps
# malloc's defaults; tests/core/test_speed.py exercises the retained allocator in subprocesses.
os.environ["LOOPVISION_CPU_ALLOCATOR"] = "system"

# `make test` runs two pytest-xdist workers on the two cores: one torch thread per worker, and the same for the
# command lines the tests start as subprocesses (OMP_NUM_THREADS is inherited), or each worker's thread pool
# spins against the other's.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    torch.manual_seed(0)
