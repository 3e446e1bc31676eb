"""Labelled shards for the classifier tests.

``kodak_labelled``: the bundled Kodak crops written as a two-class folder tree and sharded with
``loopdata.write_shards`` (exists in every clone; labels are arbitrary, so it tests plumbing, not accuracy).
``cifar10``: the shared CIFAR-10 shards (skips with the reason when ``../shared/data`` is absent).
"""

import tarfile
from pathlib import Path

import pytest

import loopdata


@pytest.fixture(scope="session")
def kodak_labelled(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("kodak-labelled")
    tree = root / "images"
    for url in loopdata.bundled_kodak_urls("train"):
        with tarfile.open(url) as tar:
            members = [m for m in tar.getmembers() if m.name.endswith((".jpg", ".png"))]
            for i, member in enumerate(sorted(members, key=lambda m: m.name)):
                folder = tree / ("class_a" if i % 2 == 0 else "class_b")
                folder.mkdir(parents=True, exist_ok=True)
                (folder / Path(member.name).name).write_bytes(tar.extractfile(member).read())
    loopdata.write_shards(tree, root / "shards", layout="classes", prefix="kodak2", max_count=6)
    return str(root / "shards")


@pytest.fixture(scope="session")
def cifar10() -> dict[str, str]:
    shared = loopdata.find_shared_data()
    if shared is None or not (shared / "cifar10" / "cifar10-train-000000.tar").is_file():
        pytest.skip("CIFAR-10 shards not found: ../shared/data (or $LOOPVISION_SHARED_DATA) is absent in this clone")
    return {split: str(shared / "cifar10" / f"cifar10-{split}-000000.tar") for split in ("train", "test")}
