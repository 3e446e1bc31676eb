"""Folders of image files as ``--data``: the same samples, order, splits and errors as shards."""

import logging
import tarfile
from pathlib import Path

import pytest
import torch
from loopdata_helpers import jpeg

import loopdata
from loopdata.folders import CHUNK_SIZE, folder_chunk_urls, scan_folder


def _kodak_folder(tmp_path: Path) -> Path:
    """The bundled kodim21-24 shard unpacked into a folder of JPEGs (keys = file stems)."""
    root = tmp_path / "kodak"
    root.mkdir()
    with tarfile.open(loopdata.bundled_kodak_urls("val")[0]) as tar:
        for member in tar.getmembers():
            if member.name.endswith(".jpg"):
                (root / member.name).write_bytes(tar.extractfile(member).read())
    return root


def _batches(urls, **kw) -> list[dict]:
    return list(loopdata.make_loader(urls, train=False, batch_size=2, resolution=64, **kw))


def test_a_folder_gives_the_same_evaluation_batches_as_its_shard(tmp_path: Path) -> None:
    folder = _kodak_folder(tmp_path)
    shard = _batches(loopdata.bundled_kodak_urls("val"), num_workers=0)
    for workers in (0, 2):
        batches = _batches(str(folder), num_workers=workers)
        assert [b["key"] for b in batches] == [b["key"] for b in shard] == [["kodim21", "kodim22"],
                                                                            ["kodim23", "kodim24"]]
        for a, b in zip(batches, shard):
            assert torch.equal(a["image"], b["image"])


def test_folders_are_read_recursively_in_sorted_order_with_class_labels(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    for rel in ("dog/b.jpg", "cat/x/a.jpg", "cat/c.png", "dog/a.JPG"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(jpeg(40, 40, seed=len(rel)))
    images = scan_folder(root)
    assert [i.relpath for i in images] == ["cat/c.png", "cat/x/a.jpg", "dog/a.JPG", "dog/b.jpg"]
    assert [i.key for i in images] == ["cat_c", "cat_x_a", "dog_a", "dog_b"]
    assert [i.label for i in images] == [0, 0, 1, 1]  # ImageFolder: index of the sorted first-level folder
    batch = next(iter(loopdata.make_loader(str(root), task="classification", train=False, batch_size=4,
                                           num_workers=0, resolution=32, num_classes=2)))
    assert batch["label"].tolist() == [0, 0, 1, 1]
    (root / "loose.jpg").write_bytes(jpeg(40, 40))  # a top-level image: no class structure, no labels
    assert all(i.label is None for i in scan_folder(root))


def test_training_on_a_folder_sees_every_image_once_per_epoch_across_ranks_and_workers(tmp_path: Path) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for i in range(CHUNK_SIZE + 40):  # two chunks
        (root / f"img{i:04d}.jpg").write_bytes(jpeg(16, 16, seed=i))
    assert len(folder_chunk_urls(root)) == 2
    keys = []
    for rank in range(2):
        loader = loopdata.make_loader(str(root), train=True, batch_size=8, num_workers=2, resolution=16, rank=rank,
                                      world_size=2, shuffle_buffer=16)
        keys += [k for batch in loader for k in batch["key"]]
    assert len(keys) == len(set(keys))  # no image twice in an epoch
    assert len(keys) >= 0.85 * (CHUNK_SIZE + 40)  # full batches only: a few per rank/worker may wait


def test_folder_errors_name_the_path_and_the_expected_forms(tmp_path: Path, caplog) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="holds neither \\*.tar shards nor image files; --data takes WebDataset"):
        loopdata.expand_urls(str(empty))
    clash = tmp_path / "clash"
    (clash / "a").mkdir(parents=True)
    (clash / "a" / "b.jpg").write_bytes(jpeg())
    (clash / "a_b.png").write_bytes(jpeg())
    with pytest.raises(ValueError, match="'a/b.jpg' and 'a_b.png' map to the same sample key 'a_b'"):
        loopdata.expand_urls(str(clash))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "one.jpg").write_bytes(jpeg())
    (mixed / "readme.md").write_text("x")
    with caplog.at_level(logging.WARNING, logger="loopdata"):
        assert len(_batches(str(mixed), num_workers=0)) == 1
    assert "1 file(s) without an image extension are not read" in caplog.text and "readme.md" in caplog.text


def test_a_folder_that_shrinks_after_planning_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "shrink"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.jpg").write_bytes(jpeg(16, 16, seed=i))
    loader = loopdata.make_loader(str(root), train=False, batch_size=1, num_workers=0, resolution=16)
    (root / "2.jpg").unlink()
    with pytest.raises(loopdata.ShardReadError, match="now holds 2 images, fewer than when the data was planned"):
        list(loader)


def test_symlinked_class_folders_are_followed_and_broken_or_looping_links_named(tmp_path: Path, caplog) -> None:
    """``cat/`` (2 images) + ``dog -> elsewhere`` (3 images): every reader sees 5 images in 2 classes, as
    ``loopdata write`` does; a broken link and a link back to the root are named, and the walk ends."""
    from loopdata.sources import scan_classes

    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    (root / "cat").mkdir(parents=True)
    elsewhere.mkdir()
    for i in range(2):
        (root / "cat" / f"c{i}.jpg").write_bytes(jpeg(24, 24, seed=i))
    for i in range(3):
        (elsewhere / f"d{i}.jpg").write_bytes(jpeg(24, 24, seed=10 + i))
    (root / "dog").symlink_to(elsewhere, target_is_directory=True)
    (root / "cat" / "gone.jpg").symlink_to(tmp_path / "missing.jpg")
    (root / "dog" / "again").symlink_to(root, target_is_directory=True)  # a loop through the link
    with caplog.at_level(logging.WARNING, logger="loopdata"):
        images = scan_folder(root)
    assert [(i.relpath, i.label) for i in images] == [("cat/c0.jpg", 0), ("cat/c1.jpg", 0), ("dog/d0.jpg", 1),
                                                       ("dog/d1.jpg", 1), ("dog/d2.jpg", 1)]
    assert "cat/gone.jpg" in caplog.text and "dog/again" in caplog.text
    assert sum(len(b["key"]) for b in _batches(str(root), num_workers=0)) == 5
    assert [item.relpath for item in scan_classes(root)[0]] == [i.relpath for i in images]  # loopdata write


def test_an_identity_whose_times_alone_moved_is_told_apart_from_other_data(tmp_path: Path) -> None:
    """A copy without -p or a `touch` moves modification times only: ``only_mtimes_differ`` says so (and the
    difference is worded as a moved time, not as changed data); a size, a name or a file count is other data."""
    import os

    from loopdata.identity import data_identity, first_set_difference, only_mtimes_differ

    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        (folder / f"im{i}.jpg").write_bytes(jpeg(seed=i))
    shard = tmp_path / "s.tar"
    with tarfile.open(shard, "w"):
        pass
    urls = [*folder_chunk_urls(folder), str(shard)]
    before = data_identity(urls, compact=False)
    for path in (folder / "im1.jpg", shard):
        os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    after = data_identity(urls, compact=False)
    difference = first_set_difference(before, after)
    assert "'im1.jpg': its modification time moved" in difference and "its size did not" in difference
    assert only_mtimes_differ(before, after)
    assert not only_mtimes_differ(data_identity(urls), data_identity(urls))  # compact lists cannot tell files apart
    (folder / "im2.jpg").write_bytes(jpeg(seed=9) + b"x")  # other content, other size
    assert not only_mtimes_differ(before, data_identity(urls, compact=False))
    (folder / "im3.jpg").write_bytes(jpeg(seed=3))  # one more file
    assert not only_mtimes_differ(before, data_identity([*folder_chunk_urls(folder), str(shard)], compact=False))
