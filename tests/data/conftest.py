"""Fixtures for loopdata tests: shards built on the fly in tmp_path, shared data or skip."""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from loopdata_helpers import jpeg, write_shard

from loopdata.assets import find_shared_data
from loopdata.shards import split_entry, update_info


@pytest.fixture
def make_shards(tmp_path: Path) -> Callable[..., list[str]]:
    """``make_shards(counts, labels=True, size=(24, 20), info=True, prefix="s")`` -> shard paths.

    Shard ``i`` holds ``counts[i]`` noise JPEGs with keys ``s{i}_{j:03d}`` and label ``(i + j) % 5``.
    """

    def make(
        counts: list[int],
        labels: bool = True,
        size: tuple[int, int] = (24, 20),
        info: bool = True,
        prefix: str = "s",
        directory: Path | None = None,
    ) -> list[str]:
        directory = directory or tmp_path / "shards"
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for i, count in enumerate(counts):
            samples = []
            for j in range(count):
                members = {"jpg": jpeg(*size, seed=1000 * i + j)}
                if labels:
                    members["cls"] = str((i + j) % 5).encode()
                samples.append((f"{prefix}{i}_{j:03d}", members))
            path = directory / f"{prefix}{i}-000000.tar"
            if count == 0:
                tarfile.open(path, "w").close()
            else:
                write_shard(path, samples)
            paths.append(str(path))
        if info:
            update_info(directory, split_entry(prefix, paths, counts))
        return paths

    return make


@pytest.fixture
def shared_data() -> Path:
    """The shared data directory, or skip: a user's clone has no ../shared/data."""
    path = find_shared_data()
    if path is None:
        pytest.skip("shared data absent (set LOOPVISION_SHARED_DATA or provide <repo>/../shared/data)")
    return path


@pytest.fixture
def imagenet_urls(shared_data: Path) -> list[str]:
    """The two ImageNet-sample shards (800 images), or skip."""
    urls = sorted(str(p) for p in (shared_data / "imagenet-sample").glob("imagenet1k-sample-*.tar"))
    if len(urls) != 2:
        pytest.skip(f"ImageNet-sample shards not found under {shared_data / 'imagenet-sample'}")
    return urls
