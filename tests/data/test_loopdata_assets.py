"""Bundled Kodak shards: present, small, valid, loadable, and regenerable from the shared source."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import PIL
import pytest
from PIL import Image

from loopdata import bundled_kodak_urls, check_shards, find_shared_data, make_loader
from loopdata.assets import bundled_kodak_dir
from loopdata.bundle_kodak import SPLITS, build_kodak_bundle
from loopdata.shards import iter_samples, read_info


def test_bundled_shards_are_small_valid_and_complete():
    sizes = 0
    for split, indices in SPLITS.items():
        urls = bundled_kodak_urls(split)
        sizes += sum(Path(u).stat().st_size for u in urls)
        report = check_shards(urls)
        assert report.ok, report.format_text()
        keys = [s["__key__"] for u in urls for s in iter_samples(u)]
        assert keys == [f"kodim{i:02d}" for i in indices]
    assert sizes < 6 * 2**20
    info = read_info(bundled_kodak_dir())
    assert "unrestricted" in info["provenance"]["license"]


def test_bundled_image_sizes():
    for url in bundled_kodak_urls("train") + bundled_kodak_urls("val"):
        for sample in iter_samples(url):
            image = Image.open(io.BytesIO(sample["jpg"]))
            assert image.format == "JPEG" and sorted(image.size) == [256, 384]
    full = [s for u in bundled_kodak_urls("full") for s in iter_samples(u)]
    for sample in full:
        image = Image.open(io.BytesIO(sample["png"]))
        assert image.format == "PNG" and image.size == (768, 512)
        assert json.loads(sample["json"])["processing"] == "original bytes"


def test_bundled_shards_feed_the_reconstruction_loader():
    loader = make_loader(bundled_kodak_urls("train"), train=True, batch_size=4, num_workers=0, resolution=64)
    batches = list(loader)
    assert len(batches) == 5 and len({k for b in batches for k in b["key"]}) == 20
    val = make_loader(bundled_kodak_urls("val"), batch_size=4, num_workers=0, resolution=128)
    batch = next(iter(val))
    assert batch["image"].shape == (4, 3, 128, 128) and "label" not in batch


def test_unknown_split_is_an_error():
    with pytest.raises(ValueError, match="unknown Kodak split"):
        bundled_kodak_urls("test")


def test_regenerating_from_the_shared_source_reproduces_the_bundle(shared_data, tmp_path):
    source = shared_data / "kodak" / "kodak-000000.tar"
    if not source.is_file():
        pytest.skip(f"shared Kodak shard absent: {source}")
    build_kodak_bundle(source, tmp_path)
    committed = read_info(bundled_kodak_dir())
    rebuilt = read_info(tmp_path)

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    # The full-resolution split holds original bytes: identical whatever the Pillow version.
    assert digest(tmp_path / "kodak-full-000000.tar") == digest(bundled_kodak_dir() / "kodak-full-000000.tar")
    if committed["provenance"]["pillow"] != PIL.__version__:
        pytest.skip(
            f"JPEG bytes depend on the encoder: bundle made with Pillow {committed['provenance']['pillow']}"
        )
    assert rebuilt["splits"] == committed["splits"]


def test_find_shared_data_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOPVISION_SHARED_DATA", str(tmp_path))
    assert find_shared_data() == tmp_path
    monkeypatch.setenv("LOOPVISION_SHARED_DATA", str(tmp_path / "absent"))
    fallback = find_shared_data()
    assert fallback is None or fallback.name == "data"
