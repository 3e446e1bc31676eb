"""Helpers shared by the test packages (importable as ``lv_testing``: pyproject puts ``tests/`` on the path;
a top-level ``tests`` package installed by torch-fidelity shadows ``tests.*`` imports).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

import loopdata

FAST = ["resolution=32", "batch_size=4", "progress_bar=false", "image_every=100"]


def randomize_(module: torch.nn.Module, std: float = 0.05, seed: int = 0) -> torch.nn.Module:
    """Overwrite every floating parameter of ``module`` with N(0, std^2) values (in place).

    Blocks start as the exact identity (zero-initialised modulation), so identity tests on freshly
    built modules would pass trivially; this gives every parameter a non-zero random value first.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return module


def data_urls(split: str = "train") -> str:
    """Comma-separated paths of the bundled Kodak shards of ``split``."""
    return ",".join(str(u) for u in loopdata.bundled_kodak_urls(split))


@contextlib.contextmanager
def small_filesystem(path, size_kib: int):
    """A real, nearly full filesystem for write-failure tests: a ``size_kib`` KiB tmpfs mounted at ``path``
    (unmounted afterwards). Skips the test, with the reason, where mounting is not permitted (not root, no
    ``mount``), so such machines still run the size-limit (RLIMIT_FSIZE) variants."""
    import subprocess

    import pytest

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
                              capture_output=True, text=True)
    except OSError as err:
        pytest.skip(f"cannot mount a tmpfs for a full-disk test: {err}")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a full-disk test: {proc.stderr.strip() or proc.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def read_only_filesystem(path, folders: tuple[str, ...] = ("old",)):
    """A real read-only filesystem at ``path`` (a tmpfs, with the empty ``folders`` made before it is remounted
    read-only; unmounted afterwards): writes there fail with EROFS, which is not a PermissionError. Skips the test,
    with the reason, where mounting is not permitted."""
    import subprocess

    import pytest

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True,
                              text=True)
    except OSError as err:
        pytest.skip(f"cannot mount a tmpfs for a read-only test: {err}")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a read-only test: {proc.stderr.strip() or proc.returncode}")
    try:
        for folder in folders:
            (path / folder).mkdir()
        proc = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot remount a tmpfs read-only: {proc.stderr.strip() or proc.returncode}")
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
